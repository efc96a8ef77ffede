"""A shared vLLM server reads pool stores its clients name: only inside the operator's roots, never a file
outside the store, and nothing a store holds reaches the engine loop (laser/vllm/sources.py, pools/store.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laser.vllm import sources
from laser.vllm.sources import ROOTS_ENV, StorePools, add_pool_roots, pool_roots, within
from pools.store import MANIFEST, PoolStore, PoolStoreError, TokenizerFingerprint, write_store

FP = TokenizerFingerprint("t", "0" * 64)


def _store(where: Path, texts: list[list[int]] | None = None) -> Path:
    write_store(where, {"a": texts or [[1, 2, 3, 4]], "b": [[5, 6, 7]]}, FP)
    return where


def _pools(*roots: Path) -> StorePools:
    return StorePools(lambda: FP, roots=[Path(os.path.realpath(r)) for r in roots])


def test_no_store_opens_outside_the_roots(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    store = _store(tmp_path / "team-a" / "pools")
    other = _store(tmp_path / "team-b" / "pools")
    assert StorePools(lambda: FP).get(store, "a") is None  # no roots set: nothing opens
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path / "team-a"))
    sp = StorePools(lambda: FP)
    assert sp.get(store, "a") is not None
    assert sp.get(other, "a") is None and "outside the pool-store roots" in sp.broken[str(other)]
    # a path that climbs out, or a link inside the root that points out, is outside too
    assert sp.get(tmp_path / "team-a" / ".." / "team-b" / "pools", "a") is None
    (tmp_path / "team-a" / "link").symlink_to(tmp_path / "team-b" / "pools")
    assert sp.get(tmp_path / "team-a" / "link", "a") is None
    assert not within(tmp_path / "team-ab", [tmp_path / "team-a"])  # a prefix is not a parent


def test_roots_from_the_environment_and_the_owner(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, os.pathsep.join([str(tmp_path / "x"), "", str(tmp_path / "y")]))
    assert pool_roots() == (tmp_path / "x", tmp_path / "y")
    assert add_pool_roots([tmp_path / "z", tmp_path / "x"]) == (tmp_path / "x", tmp_path / "y", tmp_path / "z")
    sp = _pools(tmp_path / "x")
    store = _store(tmp_path / "elsewhere")
    assert sp.get(store, "a") is None
    sp.trust(store)  # the engine's owner submits its own store: let in, and tried again
    assert sp.get(store, "a") is not None


def _manifest(store: Path) -> dict:
    return json.loads((store / MANIFEST).read_text())


def _hostile(store: Path) -> dict[str, object]:
    """Manifests a client could leave in a store it names, each a PoolStoreError at open or at read."""
    m = _manifest(store)
    part = m["pools"]["a"]["file"]
    entry = lambda **kw: {**m, "pools": {**m["pools"], "a": {**m["pools"]["a"], "snapshot": None, **kw}}}  # noqa: E731
    return {
        "array": [m],
        "no tokenizer": {k: v for k, v in m.items() if k != "tokenizer"},
        "pools a list": {**m, "pools": [1]},
        "entry a string": {**m, "pools": {"a": "x"}},
        "climbs out": entry(file="../" + part),
        "absolute": entry(file="/dev/zero"),
        "a folder": entry(file="sub"),
        "a link out": entry(file="part-link.arrow"),
        "a link to a device": entry(file="part-zero.arrow"),
        "negative offset": entry(offset=-1),
        "snapshot out": entry(snapshot="/etc/passwd.trie.arrow"),
        "members out": {**m, "members": "../members.parquet"},
    }


def test_a_manifest_names_only_regular_files_inside_its_store(tmp_path):
    store = _store(tmp_path / "s")
    (store / "sub").mkdir()
    (tmp_path / "secret.arrow").write_bytes((store / _manifest(store)["pools"]["a"]["file"]).read_bytes())
    (store / "part-link.arrow").symlink_to(tmp_path / "secret.arrow")
    (store / "part-zero.arrow").symlink_to("/dev/zero")
    good = (store / MANIFEST).read_text()
    for name, manifest in _hostile(store).items():
        (store / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(PoolStoreError):
            opened = PoolStore.open(store, tokenizer=FP)
            opened.token_ids("a")
            opened.members()
            pytest.fail(f"{name}: read")
        sp = _pools(tmp_path)
        assert sp.get(store, "a") is None, name  # contained: that request decodes without drafts
        (store / MANIFEST).write_text(good)
    assert _pools(tmp_path).get(store, "a") is not None


def test_whatever_an_opener_or_a_store_raises_never_leaves_store_pools(tmp_path, monkeypatch):
    class Broken:
        def __contains__(self, key: object) -> bool:
            raise KeyError(key)

    def opener(directory: str, tokenizer: object = None) -> object:
        if directory.endswith("attr"):
            raise AttributeError("'list' object has no attribute 'get'")
        return Broken()

    monkeypatch.setattr(sources, "store_opener", lambda: opener)
    sp = _pools(tmp_path)
    assert sp.get(tmp_path / "attr", "a") is None and sp.get(tmp_path / "key", "a") is None
    assert "AttributeError" in sp.broken[str(tmp_path / "attr")] and "KeyError" in sp.broken[str(tmp_path / "key")]


def test_a_store_rebuilt_in_place_is_read_by_generation(tmp_path):
    store = _store(tmp_path / "s", [[1, 2, 3, 4]])
    sp = _pools(tmp_path)
    assert sp.get(store, "a").open([1, 2], 8, 4, 0.0).propose([1, 2], 4).first_path() == [3, 4]
    held = sp.stores[str(store)]
    for generation in (2, 3):  # two rebuilds: the held generation's files are gone after the second
        _store(store, [[1, 2, 9, 9 + generation]])
    assert held.changed() and not (store / held.manifest["pools"]["b"]["file"]).exists()
    pool_b = sp.get(store, "b")  # not loaded before: read from the new generation, the store reopened
    assert pool_b is not None and sp.stores[str(store)].generation == 3 and not sp.broken
    sp.pools.clear()
    assert sp.get(store, "a").open([1, 2], 8, 4, 0.0).propose([1, 2], 4).first_path() == [9, 12]


def test_a_read_that_races_a_rebuild_is_retried_on_the_new_generation(tmp_path, monkeypatch):
    store = _store(tmp_path / "s")
    sp = _pools(tmp_path)
    assert sp.store(str(store)) is not None
    held = sp.stores[str(store)]
    calls = []
    real_get = PoolStore.get

    def racing_get(self: PoolStore, key: str):  # the rebuild lands between the check and the read
        calls.append(self.generation)
        if len(calls) == 1:
            _store(store, [[7, 8, 9]])
            _store(store, [[7, 8, 9]])
            (store / held.manifest["pools"][key]["file"]).unlink(missing_ok=True)
            self._pools.clear()
        return real_get(self, key)

    monkeypatch.setattr(PoolStore, "get", racing_get)
    assert sp.get(store, "a") is not None and calls == [1, 3] and not sp.broken


def test_pools_build_takes_the_store_s_lock(tmp_path):
    """A second `laser pools build` of the same store while one holds it exits 75 naming the holder."""
    import polars as pl
    from typer.testing import CliRunner

    from jobs.cli import app
    from tests.helpers import save_tiny_model

    model = save_tiny_model(tmp_path / "tiny")
    pl.DataFrame({"text": ["a b", "c d"], "g": ["x", "y"]}).write_parquet(tmp_path / "t.parquet")
    out = tmp_path / "store"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pipelines.store.lock import RunLock; RunLock({str(out)!r}).acquire(); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        for _ in range(100):
            if (out / ".run.lock").exists() and (out / ".run.lock").stat().st_size:
                break
            import time

            time.sleep(0.1)
        args = ["pools", "build", str(tmp_path / "t.parquet"), "--text-column", "text", "--group-column", "g"]
        result = CliRunner().invoke(app, [*args, "--model", str(model), "--out", str(out)])
        assert result.exit_code == 75, result.output
        assert "holds" in result.output and not (out / MANIFEST).exists()
    finally:
        holder.communicate(b"\n", timeout=30)
    result = CliRunner().invoke(app, [*args, "--model", str(model), "--out", str(out)])
    assert result.exit_code == 0, result.output  # released: the build goes ahead in the folder the lock made
