"""Nothing read from a work or output directory is unpickled: a planted file never runs code (issue 23, item 2)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from pipelines.knowledge.validation import JobInputError


class Payload:
    """Unpickling this creates ``marker``: the proof that a load ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"meta": {}, "weights": Payload(marker)}, path)
    return path


def _loaders(work: Path):
    from training import align, draft, loop, redrafter

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return {
        "examples.pt": lambda p: draft._examples(None, None, None, p.parent),
        "align_data.pt": lambda p: align._cached_data(p, {}, dict),
        "checkpoint.pt": lambda p: loop.load_checkpoint(p, model, opt, {}),
        "generated.pt": lambda p: redrafter.generated_examples(p.parent),
        "head-checkpoint.pt": lambda p: redrafter.load_checkpoint(p, model, opt, sched, None),
    }


@pytest.mark.parametrize(
    "name", ["examples.pt", "align_data.pt", "checkpoint.pt", "generated.pt", "head-checkpoint.pt"]
)
def test_planted_training_cache_is_refused_without_running_it(name, tmp_path):
    marker = tmp_path / "payload-ran"
    path = plant(tmp_path / "work" / name, marker)
    with pytest.raises(JobInputError, match="not a plain tensor file"):
        _loaders(tmp_path)[name](path)
    assert not marker.exists()


def test_plain_caches_round_trip(tmp_path):
    from training import align, draft

    work = tmp_path / "work"
    work.mkdir()
    made = draft.Example([1, 2, 3], 1, torch.ones(2, 4))
    torch.save([(made.ids, made.start, made.target_hidden)], work / "examples.pt")
    (back,) = draft._examples(None, None, None, work)
    assert back.ids == [1, 2, 3] and back.start == 1 and torch.equal(back.target_hidden, made.target_hidden)
    first = align._cached_data(
        work / "align_data.pt", {"K": 2}, lambda: {"train": [align.AlignExample([1], [[2, 3]], [4])], "held": []}
    )
    again = align._cached_data(work / "align_data.pt", {"K": 2}, lambda: pytest.fail("made twice"))
    assert again == first and isinstance(again["train"][0], align.AlignExample)


def _store_with_tampered_snapshot(tmp_path: Path, snapshot_name: str, marker: Path):
    import hashlib
    import json

    from pools.store import MANIFEST, TokenizerFingerprint, write_store

    texts = {"user/attribute/a": [[5, 6, 7, 8, 9], [5, 6, 9], [7, 8, 9, 5]]}
    write_store(tmp_path / "p", texts, TokenizerFingerprint("t", "0"))
    planted = pickle.dumps(Payload(marker))
    (tmp_path / "p" / snapshot_name).write_bytes(planted)
    manifest = json.loads((tmp_path / "p" / MANIFEST).read_text())  # the tamperer rewrites the checksum too
    manifest["pools"]["user/attribute/a"].update(
        snapshot=snapshot_name, snapshot_sha256=hashlib.sha256(planted).hexdigest()
    )
    (tmp_path / "p" / MANIFEST).write_text(json.dumps(manifest))
    return texts


@pytest.mark.parametrize("snapshot_name", ["part-planted.trie.arrow", "pool-00000.pkl"])
def test_tampered_pool_snapshot_never_runs(snapshot_name, tmp_path):
    from pools.build import materialize
    from pools.store import PoolStore

    marker = tmp_path / "payload-ran"
    texts = _store_with_tampered_snapshot(tmp_path, snapshot_name, marker)
    pool = PoolStore.open(tmp_path / "p").get("user/attribute/a")
    assert not marker.exists()
    assert pool.trie._trie == materialize(texts["user/attribute/a"]).trie._trie  # rebuilt from the texts


def test_pool_snapshot_is_plain_arrow_and_loads_the_same_pool(tmp_path):
    import pyarrow as pa

    from pools.build import materialize
    from pools.store import PoolStore, TokenizerFingerprint, write_store

    texts = [[5, 6, 7, 8, 9, 10], [5, 6, 9], [7, 8, 9, 5, 6, 7], [11]]
    write_store(tmp_path / "p", {"k": texts}, TokenizerFingerprint("t", "0"))
    snapshot = PoolStore.open(tmp_path / "p").manifest["pools"]["k"]["snapshot"]
    assert snapshot.endswith(".trie.arrow")
    with pa.memory_map(str(tmp_path / "p" / snapshot)) as src:
        table = pa.ipc.open_file(src).read_all()
    assert table.column_names == ["state"] and table.schema.field("state").type == pa.int64()
    loaded, built = PoolStore.open(tmp_path / "p").get("k"), materialize(texts)
    assert loaded.trie._trie == built.trie._trie and len(loaded) == len(built) and loaded.texts == built.texts == 4
    for context in ([5, 6], [7], [9, 5]):
        a, b = loaded.retrieve(context, max_nodes=8), built.retrieve(context, max_nodes=8)
        assert list(a.tokens) == list(b.tokens) and list(a.parents) == list(b.parents)
    assert not list((tmp_path / "p").glob("*.pkl"))
