"""Output files honour the umask like a normal write (mkstemp alone would leave them 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from pipelines.store import knowledge as kn
from pools.store import TokenizerFingerprint, write_store
from tests.helpers import knowledge_row as row


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_knowledge_shards_and_manifest_are_world_readable(tmp_path, umask_022):
    with kn.KnowledgeWriter(tmp_path, shard_rows=2) as w:
        for i in range(3):
            w.add(row(i))
    files = sorted(tmp_path.glob("part-*.parquet")) + [tmp_path / "manifest.json"]
    assert len(files) == 3
    assert {mode(p) for p in files} == {0o644}


def test_pool_store_files_are_world_readable(tmp_path, umask_022):
    write_store(tmp_path, {"user/attribute/a": [[1, 2, 3], [2, 3]]}, TokenizerFingerprint("t", "0" * 64))
    files = list(tmp_path.iterdir())
    assert len(files) == 3  # arrow, trie snapshot (integers), manifest
    assert {mode(p) for p in files} == {0o644}


def test_routing_file_is_world_readable(tmp_path, umask_022):
    import router
    from router.router import ROUTING_SCHEMA

    path = router.write_routing(ROUTING_SCHEMA.empty_table(), tmp_path / "routing.parquet")
    assert mode(path) == 0o644


def test_a_strict_umask_is_honoured_too(tmp_path):
    old = os.umask(0o077)
    try:
        with kn.KnowledgeWriter(tmp_path, shard_rows=1) as w:
            w.add(row(0))
    finally:
        os.umask(old)
    assert mode(tmp_path / "part-00000.parquet") == 0o600


def test_the_umask_is_read_without_opening_a_window(umask_022, monkeypatch):
    """file_mode reads the umask where the kernel shows it: the process's umask never changes, so no file
    another thread makes meanwhile gets 0o666."""
    from laser import files

    seen = []
    monkeypatch.setattr(files.os, "umask", lambda m: seen.append(m) or 0o022)
    assert files.file_mode() == 0o644
    if os.path.exists("/proc/self/status"):
        assert seen == []  # read from /proc: os.umask never called
