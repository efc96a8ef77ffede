"""Knowledge Parquet store: schema, atomic shards, manifest, resume after a crash, failures."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.store import knowledge as kn, shards as ss
from tests.helpers import knowledge_row as row


def write_run(store, ids, shard_rows=3, close=True):
    """Write rows for ``ids`` skipping done keys, as a resumed job does; ``close=False`` simulates a crash."""
    done = ss.done_keys(store)
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
    assert ss.done_keys(tmp_path) == {("user", f"u{i}") for i in range(6)}
    w = write_run(tmp_path, range(10), shard_rows=3)
    assert w.rows_written == 4
    ids = kn.read_knowledge(tmp_path, dedup=False)["entity_id"].to_list()
    assert sorted(ids) == sorted(f"u{i}" for i in range(10))
    assert len(ids) == len(set(ids)) == 10


def test_crash_after_rename_before_manifest_adopts_the_shard(tmp_path, monkeypatch):
    write_run(tmp_path, range(3), shard_rows=3)  # one shard, in the manifest
    monkeypatch.setattr(ss.Manifest, "save", lambda self, store: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        write_run(tmp_path, range(6), shard_rows=3)
    monkeypatch.undo()
    assert len(json.loads((tmp_path / "manifest.json").read_text())["shards"]) == 1
    assert (tmp_path / "part-00001.parquet").exists()
    assert len(ss.done_keys(tmp_path)) == 6  # the renamed shard is complete, so readers see it
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
    assert ss.done_keys(tmp_path) == {("user", f"u{i}") for i in range(3)}
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
    failures = ss.read_failures(tmp_path)
    assert failures.select("entity_type", "entity_id", "reason", "run_id").rows() == [
        ("user", "u1", "prompt: no history", "r1"),
        ("item", "i9", "ValueError: bad title", "r1"),
    ]
    write_run(tmp_path, [1])  # retried successfully
    assert ss.read_failures(tmp_path)["entity_id"].to_list() == ["i9"]
    assert ss.read_failures(tmp_path, unresolved=False).height == 2


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
        assert len(ss.done_keys(store)) == 4 and kn.read_knowledge(store).height == 4  # readers skip it
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
        assert ss.done_keys(store) == {("user", f"u{i}") for i in range(5)}  # a reader: rebuilt in memory
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
    monkeypatch.setattr(ss.Manifest, "save", lambda self, root: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError):
        kn.KnowledgeWriter(store)
    monkeypatch.undo()
    assert (store / "manifest.json").read_text() == '{"shards": ['  # never half-replaced
    kn.KnowledgeWriter(store)
    assert len(json.loads((store / "manifest.json").read_text())["shards"]) == 2


# ---- one writer per store: a writer holds the lock of the store's folder (a shared old_knowledge.path) ----


def test_a_writer_holds_its_store_lock_until_closed(tmp_path):
    from pipelines.store.lock import LockHeld, RunLock

    store = tmp_path / "shared_old"
    with RunLock(store, run_id="other job"):  # another job writing the shared store
        with pytest.raises(LockHeld, match=r"shared_old/\.run\.lock: another run holds"):
            kn.KnowledgeWriter(store)
        with pytest.raises(LockHeld):
            ss.open_shards(store)
    assert not (store / "manifest.json").exists()  # nothing written while the other held it
    w = write_run(store, range(2), close=False)
    with pytest.raises(LockHeld):  # held while it writes
        RunLock(store, run_id="other job").acquire()
    w.close()
    RunLock(store, run_id="other job").acquire().release()  # let go on close
    assert len(ss.done_keys(store)) == 2


# ---- the commit log: O(1) commits, checkpoints, compaction, lazy checksums, the index (issue 47) ----


def test_a_commit_appends_one_small_log_line_whatever_the_number_of_shards(tmp_path, monkeypatch):
    store = tmp_path / "k"
    monkeypatch.setattr(ss, "CHECKPOINT_MIN", 10_000)  # no checkpoint in between: every line stays to be measured
    rewritten, lines = [], []
    real_write, real_put = ss.Location.write_bytes, ss._put_log_entry
    monkeypatch.setattr(
        ss.Location, "write_bytes", lambda self, data: (rewritten.append(self.name), real_write(self, data))
    )
    monkeypatch.setattr(ss, "_put_log_entry", lambda path, data: (lines.append(len(data)), real_put(path, data)))
    w = kn.KnowledgeWriter(store, shard_rows=1, run_id="r1", compact_after=None)
    rewritten.clear()
    grown = []
    for i in range(300):
        before = sum(p.stat().st_size for p in (store / "log").glob("*"))
        w.add(row(i))
        grown.append(sum(p.stat().st_size for p in (store / "log").glob("*")) - before)
    assert rewritten == [] and len(lines) == 300  # the manifest is never rewritten: one log line a commit
    assert grown == lines and max(grown) - min(grown) <= 4 and max(grown) < 300  # digits grow, nothing else
    assert ss.done_keys(store) == {("user", f"u{i}") for i in range(300)}  # readers see checkpoint + log
    w.close()  # folded into a checkpoint, the log emptied
    assert not list((store / "log").glob("*")) and len(ss.Manifest.load(store).shards) == 300


def test_checkpoints_come_once_the_log_is_as_long_as_the_checkpoint(tmp_path, monkeypatch):
    store = tmp_path / "k"
    monkeypatch.setattr(ss, "CHECKPOINT_MIN", 4)
    saves = []
    real = ss.Manifest.save
    monkeypatch.setattr(ss.Manifest, "save", lambda self, where: (saves.append(len(self.shards)), real(self, where)))
    with kn.KnowledgeWriter(store, shard_rows=1, compact_after=None) as w:
        for i in range(40):
            w.add(row(i))
    assert saves == [0, 4, 8, 16, 32, 40]  # the open (a new store), doubling, the close: O(1) a commit on average
    assert kn.read_knowledge(store).height == 40


def test_a_store_in_the_old_manifest_format_still_reads_and_takes_new_rows(tmp_path):
    store = tmp_path / "old"
    store.mkdir()
    shards = []
    for n, ids in enumerate([range(0, 3), range(3, 5)]):  # as the writer before the log wrote them
        name = f"part-{n:05d}.parquet"
        table = pa.Table.from_pylist([kn.with_quality(row(i)) for i in ids], schema=kn.KNOWLEDGE_SCHEMA)
        pq.write_table(table.drop(["config_hash", "run_seq", "source_hash"]), store / name)  # older columns too
        shards.append({"file": name, "rows": table.num_rows, "run_id": "r1", "sha256": ss.file_sha256(store / name)})
    (store / "manifest.json").write_text(json.dumps({"format": "laser-knowledge/1", "shards": shards}, indent=1))
    assert kn.read_knowledge(store)["entity_id"].to_list() == [f"u{i}" for i in range(5)]
    index = kn.read_index(store)
    assert index["entity_id"].to_list() == [f"u{i}" for i in range(5)] and index["source_hash"].null_count() == 5
    assert ss.done_keys(store) == {("user", f"u{i}") for i in range(5)}
    write_run(store, range(8))
    assert kn.read_knowledge(store)["entity_id"].to_list() == [f"u{i}" for i in range(8)]
    assert json.loads((store / "manifest.json").read_text())["format"] == "laser-knowledge/2"


def test_the_index_reads_no_text(tmp_path, monkeypatch):
    write_run(tmp_path, range(7), shard_rows=2)
    asked = []
    real = pq.read_table

    def spy(source, **kw):
        asked.append(kw.get("columns"))
        return real(source, **kw)

    monkeypatch.setattr(ss.pq, "read_table", spy)
    index = kn.read_index(tmp_path)
    assert len(asked) == 4 and all(cols is not None and "knowledge" not in cols for cols in asked)
    assert index.columns == [*kn.INDEX_COLUMNS, kn.POSITION] and index[kn.POSITION].to_list() == list(range(7))
    asked.clear()
    rows = index.filter(index["entity_id"].is_in(["u1", "u5"]))
    assert kn.knowledge_at(tmp_path, rows) == {("user", "u1"): "likes film 1", ("user", "u5"): "likes film 5"}
    assert len(asked) == 2  # only the two shards that hold them


def test_plan_from_the_index_fetches_only_the_planned_entities_texts(tmp_path):
    from pipelines.knowledge.plan import plan_changes
    from pipelines.workers import GenerationRequest

    with kn.KnowledgeWriter(tmp_path, shard_rows=2, run_id="r1") as w:
        for i in range(6):
            w.add({**row(i), "source_hash": f"h{i}", "config_hash": "c"})
    asked = []
    reqs = [GenerationRequest("user", f"u{i}", source_hash=f"h{i}" if i != 2 else "new") for i in range(7)]
    plan = plan_changes(
        reqs,
        kn.read_index(tmp_path),
        "c",
        texts=lambda rows: (asked.append(rows.height), kn.knowledge_at(tmp_path, rows))[1],
    )
    assert [r.entity_id for r in plan.todo] == ["u2", "u6"] and (plan.new, plan.changed) == (1, 1)
    assert plan.earlier == {("user", "u2"): "likes film 2"} and asked == [1]
    full = plan_changes(reqs, kn.read_knowledge(tmp_path), "c")  # the texts in the rows: as before
    assert [r.entity_id for r in full.todo] == ["u2", "u6"] and len(full.earlier) == 6


def test_compaction_keeps_every_row_once_and_in_order(tmp_path):
    store = tmp_path / "k"
    for run in range(3):  # three runs of small shards, the same entities rewritten
        with kn.KnowledgeWriter(store, shard_rows=3, run_id=f"r{run}", compact_after=None) as w:
            for i in range(10):
                w.add(row(i, run_id=f"r{run}"))
    before = kn.read_knowledge(store, dedup=False)
    assert len(ss.Manifest.load(store).shards) == 12
    assert ss.compact_store(store, kn.KNOWLEDGE_SCHEMA, target_rows=16) == 12
    shards = ss.Manifest.load(store).shards
    assert [s["rows"] for s in shards] == [16, 14] and all("-c-" in s["file"] for s in shards)
    assert sorted(p.name for p in store.glob("part-*.parquet")) == sorted(s["file"] for s in shards)
    assert kn.read_knowledge(store, dedup=False).equals(before)  # every row once, in write order
    assert kn.read_index(store)[kn.POSITION].to_list() == list(range(30))
    assert ss.compact_store(store, kn.KNOWLEDGE_SCHEMA, target_rows=16) == 0  # nothing small left
    # merged shards merge again, when small for the target
    assert ss.compact_store(store, kn.KNOWLEDGE_SCHEMA, target_rows=128) == 2
    assert kn.read_knowledge(store, dedup=False).equals(before)


def test_a_writer_compacts_once_small_shards_pile_up(tmp_path):
    store = tmp_path / "k"
    with kn.KnowledgeWriter(store, shard_rows=2, compact_after=5, compact_rows=12) as w:
        for i in range(40):
            w.add(row(i))
    shards = ss.Manifest.load(store).shards
    assert len(shards) < 10 and sum(s["rows"] for s in shards) == 40
    assert kn.read_knowledge(store, dedup=False)["entity_id"].to_list() == [f"u{i}" for i in range(40)]
    assert len(list(store.glob("part-*.parquet"))) == len(shards)


def test_a_reader_follows_a_shard_that_a_compaction_replaced_under_it(tmp_path):
    store = tmp_path / "k"
    write_run(store, range(9), shard_rows=3)
    stream = kn.iter_knowledge(store, ["entity_id"], batch_rows=2)
    first = next(stream)  # the reader is inside shard 0
    ss.compact_store(store, kn.KNOWLEDGE_SCHEMA)  # shards 0..2 become one
    ids = first.column(0).to_pylist() + [i for b in stream for i in b.column(0).to_pylist()]
    assert ids == [f"u{i}" for i in range(9)]
    assert len(ss.done_keys(store)) == 9


def test_opening_checks_no_checksum_reading_does(tmp_path, monkeypatch):
    store = tmp_path / "k"
    write_run(store, range(6), shard_rows=2)
    data = bytearray((store / "part-00001.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (store / "part-00001.parquet").write_bytes(bytes(data))
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(ss.hashlib, "sha256", lambda *a: (hashed.append(1), real(*a))[1])
    kn.KnowledgeWriter(store).close()  # a writer's open: no shard hashed
    assert hashed == []
    with pytest.raises(ss.CorruptShardError, match="part-00001.parquet: checksum mismatch"):
        kn.read_index(store)
    ss.open_shards(store)  # the run's verifying open moves it aside
    assert (store / "quarantine" / "part-00001.parquet").exists()
    assert kn.read_index(store)["entity_id"].to_list() == ["u0", "u1", "u4", "u5"]


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_path, monkeypatch):
    store = tmp_path / "k"
    write_run(store, range(4), shard_rows=2)
    old = time.time() - 60
    for p in store.glob("part-*.parquet"):
        os.utime(p, (old, old))  # written a while ago
    kn.read_index(store)
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(ss.hashlib, "sha256", lambda *a: (hashed.append(1), real(*a))[1])
    kn.read_index(store)
    kn.read_knowledge(store)
    assert hashed == []
    (store / "part-00000.parquet").write_bytes((store / "part-00000.parquet").read_bytes()[:-1] + b"X")
    with pytest.raises(ss.CorruptShardError, match="checksum mismatch"):
        kn.read_knowledge(store)


def test_a_torn_log_line_is_rebuilt_from_the_shards_a_cut_last_line_ignored(tmp_path, caplog):
    store = tmp_path / "k"
    w = write_run(store, range(6), shard_rows=2, close=False)  # lines in the log, no checkpoint of them yet
    w._lock.close()
    log_file = store / "log" / "000000000000.jsonl"
    lines = log_file.read_bytes().split(b"\n")
    log_file.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:20])  # a commit cut short by a crash
    assert len(ss.Manifest.load(store).shards) == 2 and len(ss.done_keys(store)) == 6  # its shard: adopted
    log_file.write_bytes(lines[0] + b"\n" + lines[1][:20] + b"\n" + lines[2] + b"\n")  # torn in the middle
    with caplog.at_level("WARNING"):
        assert len(ss.done_keys(store)) == 6  # a reader: from the shards
    assert "000000000000.jsonl: unreadable knowledge log entry" in caplog.text
    kn.KnowledgeWriter(store).close()
    assert not list((store / "log").glob("*")) and len(ss.Manifest.load(store).shards) == 3


def test_latest_view_from_the_index_is_the_view_of_every_row(tmp_path):
    import polars as pl

    from pipelines.ops.schedule.latest import latest_view, newest_per_entity
    from tests.helpers import run_row

    for seq, ids in ((1, range(7)), (2, range(0, 7, 3)), (None, range(5, 9))):  # None: rows before run_seq
        with kn.KnowledgeWriter(tmp_path / "k", shard_rows=2, run_id=f"r{seq}", run_seq=seq) as w:
            for i in ids:
                w.add(run_row("user", f"u{i}", f"text {i} of run {seq}", f"r{seq}"))
    with kn.KnowledgeWriter(tmp_path / "o", shard_rows=3, run_id="old") as w:
        for i in range(4, 12):
            w.add(run_row("user" if i < 9 else "item", f"u{i}", f"old {i}", "old"))
    every = pl.concat(
        [
            kn.read_knowledge(tmp_path / s).with_columns(store=pl.lit(n))
            for s, n in (("k", "knowledge"), ("o", "old_knowledge"))
        ]
    )
    view = latest_view(tmp_path / "k", tmp_path / "o")
    assert view.equals(newest_per_entity(every)) and view.height == 12
    assert view.filter(pl.col("entity_id") == "u3")["knowledge"].item() == "text 3 of run 2"
    texts = latest_view(tmp_path / "k", columns=["entity_id", "knowledge"])
    assert texts.columns == ["entity_type", "entity_id", "knowledge", "store"] and texts.height == 9


def test_a_torn_checkpoint_after_a_compaction_is_rebuilt_with_every_row_once(tmp_path):
    store = tmp_path / "k"
    write_run(store, range(9), shard_rows=3)
    kept = (store / "part-00001.parquet").read_bytes()
    ss.compact_store(store, kn.KNOWLEDGE_SCHEMA)
    (store / "part-00001.parquet").write_bytes(kept)  # a replaced shard a kill left behind
    (store / "manifest.json").write_text('{"shards": [')
    assert sorted(kn.read_knowledge(store, dedup=False)["entity_id"]) == [f"u{i}" for i in range(9)]
    kn.KnowledgeWriter(store).close()  # rebuilt: the merged shard kept, the replaced one deleted
    assert [p.name for p in store.glob("part-*.parquet")] == [s["file"] for s in ss.Manifest.load(store).shards]
    assert sorted(kn.read_knowledge(store, dedup=False)["entity_id"]) == [f"u{i}" for i in range(9)]


# ---- the write path's cost per row (issue 47) -------------------------------------------------------------


def test_a_row_without_quality_is_scored_once_with_the_scores_of_text_quality(tmp_path, monkeypatch):
    from pipelines import quality

    calls = []
    real = quality.text_quality
    monkeypatch.setattr(quality, "text_quality", lambda *a, **k: calls.append(a) or real(*a, **k))
    text = "A dark night. A dark night. A dark night. A dark night (cut"
    out = kn.with_quality(row(1) | {"knowledge": text, "finish_reason": "length"})
    assert len(calls) == 1
    q = real(text, "length")
    assert {
        k: out[k] for k in ("finished_eos", "repeat_4gram", "degenerate", "ended", "cut", "fragment", "n_words")
    } == {
        "finished_eos": False,
        "repeat_4gram": q.repeat_4gram,
        "degenerate": True,
        "ended": False,
        "cut": True,
        "fragment": True,
        "n_words": q.n_words,
    }
    given = kn.with_quality(
        row(2)
        | {
            "finished_eos": True,
            "repeat_4gram": 0.5,
            "degenerate": False,
            "ended": True,
            "cut": False,
            "fragment": False,
            "n_words": 9,
        }
    )
    assert len(calls) == 1 and (given["repeat_4gram"], given["n_words"]) == (0.5, 9)  # given: not scored


def test_a_writer_compacts_the_shards_it_wrote_without_reading_them_back(tmp_path, monkeypatch):
    store = tmp_path / "k"
    with kn.KnowledgeWriter(store, shard_rows=2, run_id="r0", compact_after=None) as w:
        for i in range(3):  # an earlier run's small shards: read from disk by the next compaction
            w.add(row(i, run_id="r0"))
    reads = []
    real = ss.read_shard
    monkeypatch.setattr(
        ss, "read_shard", lambda root, shard, *a, **k: reads.append(shard["file"]) or real(root, shard, *a, **k)
    )
    with kn.KnowledgeWriter(store, shard_rows=2, compact_after=5, compact_rows=12) as w:
        for i in range(3, 60):
            w.add(row(i))
            assert sum(t.num_rows for t in w._held.values()) <= 12  # bounded: one merged shard's rows
    merged = [s for s in ss.Manifest.load(store).shards if "-c-" in s["file"]]
    assert len(merged) >= 4  # several compactions, each fed from the writer's own tables
    assert reads == ["part-00000.parquet", "part-00001.parquet"]  # only the earlier run's shards
    monkeypatch.setattr(ss, "read_shard", real)
    assert kn.read_knowledge(store, dedup=False)["entity_id"].to_list() == [f"u{i}" for i in range(60)]
    assert len(list(store.glob("part-*.parquet"))) == len(ss.Manifest.load(store).shards)


def test_a_row_with_an_unknown_column_is_refused_naming_it(tmp_path):
    w = kn.KnowledgeWriter(tmp_path, shard_rows=10)
    with pytest.raises(ValueError, match=r"user/u1 has unknown column\(s\) \['colour'\]"):
        w.add({**row(1), "colour": "red"})
    with pytest.raises(ValueError, match=r"user/u2 lacks \['knowledge'\]"):
        kn.KnowledgeRow.from_mapping({k: v for k, v in row(2).items() if k != "knowledge"})


def test_a_knowledge_row_writes_as_its_mapping_does(tmp_path):
    with kn.KnowledgeWriter(tmp_path / "a", shard_rows=10) as w:
        w.add(kn.KnowledgeRow.from_mapping(row(1)))
    with kn.KnowledgeWriter(tmp_path / "b", shard_rows=10) as w:
        w.add(row(1))
    a, b = (kn.read_knowledge(tmp_path / n).drop("generated_at") for n in "ab")
    assert a.equals(b) and a.columns == [c for c in kn.KNOWLEDGE_SCHEMA.names if c != "generated_at"]
    assert list(kn.KnowledgeRow.from_mapping(row(1)).as_dict()) == kn.KNOWLEDGE_SCHEMA.names


def test_a_writer_of_a_row_subclass_refuses_a_plain_row_naming_both(tmp_path):
    from dataclasses import dataclass

    @dataclass(slots=True, kw_only=True)
    class MoodRow(kn.KnowledgeRow):
        mood: str | None = kn.column(pa.string(), "the text's mood")

    class MoodWriter(kn.KnowledgeWriter):
        row_type = MoodRow

    w = MoodWriter(tmp_path, shard_rows=10)
    with pytest.raises(TypeError, match="a KnowledgeRow given to a writer of MoodRow"):
        w.add(kn.KnowledgeRow.from_mapping(row(1)))
    assert w.complete(MoodRow.from_mapping({**row(2), "mood": "calm"}))["mood"] == "calm"


def test_a_name_that_is_no_shard_file_is_refused_naming_it():
    assert ss._shard_number("part-00012-c-0123abcd.parquet") == 12 and ss._is_merged("part-00012-c-0123abcd.parquet")
    with pytest.raises(ValueError, match=r"notes\.parquet: not a shard file name"):
        ss._shard_number("notes.parquet")
