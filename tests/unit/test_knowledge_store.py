"""Knowledge Parquet store: schema, atomic shards, manifest, resume after a crash, failures."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import knowledge_store as kn
from tests.helpers import knowledge_row as row


def write_run(store, ids, shard_rows=3, close=True):
    """Write rows for ``ids`` skipping done keys, as a resumed job does; ``close=False`` simulates a crash."""
    done = kn.done_keys(store)
    w = kn.KnowledgeWriter(store, shard_rows=shard_rows, run_id="r1")
    for i in ids:
        if ("user", f"u{i}") not in done:
            w.add(row(i))
    if close:
        w.close()
    return w


def test_shards_manifest_and_schema(tmp_path):
    w = write_run(tmp_path, range(7), shard_rows=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["rows"] for s in manifest["shards"]] == [3, 3, 1]
    assert [s["file"] for s in manifest["shards"]] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert w.rows_written == 7
    table = kn.read_knowledge_arrow(tmp_path)
    assert table.schema.equals(kn.KNOWLEDGE_SCHEMA)
    assert table.column("entity_id").to_pylist() == [f"u{i}" for i in range(7)]
    assert table.schema.field("generated_at").type == pa.timestamp("us", tz="UTC")
    assert json.loads(table.column("decoder_params")[0].as_py()) == {"k": 2, "p": 0.1}
    assert not list(tmp_path.glob(".*.tmp"))


def test_crash_between_shards_then_resume_has_no_loss_and_no_duplicate(tmp_path):
    write_run(tmp_path, range(8), shard_rows=3, close=False)  # crash: rows 6, 7 were only buffered
    assert kn.done_keys(tmp_path) == {("user", f"u{i}") for i in range(6)}
    w = write_run(tmp_path, range(10), shard_rows=3)
    assert w.rows_written == 4
    ids = kn.read_knowledge(tmp_path, dedup=False)["entity_id"].to_list()
    assert sorted(ids) == sorted(f"u{i}" for i in range(10))
    assert len(ids) == len(set(ids)) == 10


def test_crash_after_rename_before_manifest_adopts_the_shard(tmp_path, monkeypatch):
    write_run(tmp_path, range(3), shard_rows=3)  # one shard, in the manifest
    monkeypatch.setattr(kn.Manifest, "save", lambda self, store: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        write_run(tmp_path, range(6), shard_rows=3)
    monkeypatch.undo()
    assert len(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == 1
    assert (tmp_path / "part-00001.parquet").exists()
    assert len(kn.done_keys(tmp_path)) == 6  # the renamed shard is complete, so readers see it
    assert len(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == 1  # readers write nothing
    kn.KnowledgeWriter(tmp_path, shard_rows=3)  # a writer adopts it
    assert len(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == 2
    assert kn.read_knowledge(tmp_path).height == 6


def test_crash_while_writing_a_shard_leaves_no_partial_shard(tmp_path, monkeypatch):
    def torn_write(table, where, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a shard")
        raise KeyboardInterrupt

    write_run(tmp_path, range(3), shard_rows=3)
    monkeypatch.setattr(pq, "write_table", torn_write)
    with pytest.raises(KeyboardInterrupt):
        write_run(tmp_path, range(6), shard_rows=3)
    monkeypatch.undo()
    (tmp_path / ".part-00001.parquet.leftover.tmp").write_bytes(b"junk")  # a temp file a kill -9 left behind
    assert kn.done_keys(tmp_path) == {("user", f"u{i}") for i in range(3)}
    assert list(tmp_path.glob(".*.tmp"))  # readers leave it (it may belong to a live writer)
    kn.KnowledgeWriter(tmp_path)  # the next writer clears it
    assert not list(tmp_path.glob(".*.tmp"))
    assert [p.name for p in tmp_path.glob("*.parquet")] == ["part-00000.parquet"]


def test_bad_row_is_named(tmp_path):
    w = kn.KnowledgeWriter(tmp_path, shard_rows=10)
    bad = row(1)
    del bad["n_tokens"]
    with pytest.raises(ValueError, match=r"user/u1 lacks \['n_tokens'\]"):
        w.add(bad)
    w.add({**row(2), "n_tokens": "many"})
    with pytest.raises(ValueError, match="do not match the schema"):
        w.flush()


def test_failures_recorded_and_resolved_by_a_later_success(tmp_path):
    w = kn.KnowledgeWriter(tmp_path, shard_rows=2, run_id="r1")
    w.add(row(0))
    w.add_failure("user", "u1", "prompt: no history")
    w.add_failure("item", "i9", "ValueError: bad title")
    w.close()
    with open(tmp_path / "failures.jsonl", "a") as fh:
        fh.write('{"entity_type": "us')  # torn last line
    failures = kn.read_failures(tmp_path)
    assert failures.select("entity_type", "entity_id", "reason", "run_id").rows() == [
        ("user", "u1", "prompt: no history", "r1"), ("item", "i9", "ValueError: bad title", "r1")]
    write_run(tmp_path, [1])  # retried successfully
    assert kn.read_failures(tmp_path)["entity_id"].to_list() == ["i9"]
    assert kn.read_failures(tmp_path, unresolved=False).height == 2


def test_reader_dedups_and_reads_empty_store(tmp_path):
    assert kn.read_knowledge(tmp_path / "none").height == 0
    assert kn.read_knowledge(tmp_path / "none").columns == kn.KNOWLEDGE_SCHEMA.names
    w = kn.KnowledgeWriter(tmp_path, shard_rows=1, run_id="r1")
    w.add(row(0))
    w.add({**row(0), "knowledge": "second copy"})
    w.close()
    frame = kn.read_knowledge(tmp_path)
    assert frame["knowledge"].to_list() == ["likes film 0"]
    assert kn.read_knowledge(tmp_path, dedup=False).height == 2
    assert kn.knowledge_texts(tmp_path, "user") == {("user", "u0"): "likes film 0"}


def test_unreadable_unlisted_shard_is_named_moved_aside_and_the_run_goes_on(tmp_path, caplog):
    store = tmp_path / "k"
    write_run(store, range(4), shard_rows=2)
    (store / "part-00007.parquet").write_bytes(b"not parquet at all")  # unlisted and unreadable
    with caplog.at_level("ERROR"):
        assert len(kn.done_keys(store)) == 4 and kn.read_knowledge(store).height == 4  # readers skip it
    assert "part-00007.parquet: unreadable shard not in the manifest" in caplog.text
    write_run(store, range(6), shard_rows=2)  # a writer moves it aside and goes on
    assert (store / "quarantine" / "part-00007.parquet").exists() and not (store / "part-00007.parquet").exists()
    assert sorted(kn.read_knowledge(store)["entity_id"]) == [f"u{i}" for i in range(6)]


# ---- a torn manifest: rebuilt from the shards by the next writer, read from them by readers ----

@pytest.mark.parametrize("torn", ['{"shards": [', "", '{"shards": [{"file": "part-00000.parquet"}]}', "[1, 2]"])
def test_torn_manifest_is_rebuilt_from_the_shards_by_a_writer(tmp_path, caplog, torn):
    store = tmp_path / "k"
    write_run(store, range(5), shard_rows=2)
    before = json.loads((store / "manifest.json").read_text())["shards"]
    (store / "part-00009.parquet").write_bytes(b"PAR1 torn too")  # an unreadable shard beside them
    (store / "manifest.json").write_text(torn)
    with caplog.at_level("WARNING"):
        assert kn.done_keys(store) == {("user", f"u{i}") for i in range(5)}  # a reader: rebuilt in memory
    assert (store / "manifest.json").read_text() == torn  # readers write nothing
    caplog.clear()
    with caplog.at_level("WARNING"):
        w = write_run(store, range(7), shard_rows=2)  # a writer rebuilds it, then resumes
    rebuilt = [r.message for r in caplog.records if "rebuilt from the" in r.message]
    assert len(rebuilt) == 1 and "unreadable knowledge manifest" in rebuilt[0] and "1 unreadable moved" in rebuilt[0]
    shards = json.loads((store / "manifest.json").read_text())["shards"]
    assert shards[:3] == before  # the same files, row counts, run ids and sha256s as the writer had recorded
    assert w.rows_written == 2 and (store / "quarantine" / "part-00009.parquet").exists()
    assert sorted(kn.read_knowledge(store)["entity_id"]) == [f"u{i}" for i in range(7)]


def test_writer_killed_while_rebuilding_leaves_the_manifest_torn_for_the_next(tmp_path, monkeypatch):
    store = tmp_path / "k"
    write_run(store, range(4), shard_rows=2)
    (store / "manifest.json").write_text('{"shards": [')
    monkeypatch.setattr(kn.Manifest, "save", lambda self, root: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError):
        kn.KnowledgeWriter(store)
    monkeypatch.undo()
    assert (store / "manifest.json").read_text() == '{"shards": ['  # never half-replaced
    kn.KnowledgeWriter(store)
    assert len(json.loads((store / "manifest.json").read_text())["shards"]) == 2


# ---- one writer per store: a writer holds the lock of the store's folder (a shared old_knowledge.path) ----

def test_a_writer_holds_its_store_lock_until_closed(tmp_path):
    from pipelines.lock import LockHeld, RunLock

    store = tmp_path / "shared_old"
    with RunLock(store, run_id="other job"):  # another job writing the shared store
        with pytest.raises(LockHeld, match=r"shared_old/\.run\.lock: another run holds"):
            kn.KnowledgeWriter(store)
        with pytest.raises(LockHeld):
            kn.open_store(store)
    assert not (store / "manifest.json").exists()  # nothing written while the other held it
    w = write_run(store, range(2), close=False)
    with pytest.raises(LockHeld):  # held while it writes
        RunLock(store, run_id="other job").acquire()
    w.close()
    RunLock(store, run_id="other job").acquire().release()  # let go on close
    assert len(kn.done_keys(store)) == 2
