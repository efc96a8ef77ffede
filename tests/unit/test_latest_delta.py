"""The latest view as a Delta Lake table: merged run by run (only the stores' new rows), readable by
polars and delta-rs alone, time travel, rebuilt whole when the stores no longer match its marks."""

from __future__ import annotations

import polars as pl
import pytest
from deltalake import DeltaTable

from pipelines.store import knowledge as kn
from pipelines.store.lock import output_lock
from pipelines.ops.schedule import latest as lt
from pipelines.store.location import StorageError
from tests.helpers import knowledge_row as row


def write(store, ids, run_id, run_seq, text="v"):
    with kn.KnowledgeWriter(store, shard_rows=2, run_id=run_id, run_seq=run_seq) as w:
        for i in ids:
            w.add(row(i, run_id=run_id) | {"knowledge": f"{text}{i}"})


def update(out, **kw):
    with output_lock(out, run_id="test"):
        return lt.update_latest(out, out / "knowledge", run_id="r", **kw)


def test_runs_merge_their_rows_and_every_version_reads_back(tmp_path):
    store = tmp_path / "knowledge"
    write(store, range(5), "r1", 1, "a")
    assert update(tmp_path) == 5  # no table yet: written whole
    write(store, [1, 7], "r2", 2, "b")
    assert update(tmp_path) == 2  # the rows committed since: u1 replaced, u7 inserted
    assert update(tmp_path) == 0  # nothing new: no version
    view = pl.read_delta(str(tmp_path / "latest"))  # a plain Delta reader, no laser code
    texts = dict(zip(view["entity_id"], view["knowledge"]))
    assert texts == {"u0": "a0", "u1": "b1", "u2": "a2", "u3": "a3", "u4": "a4", "u7": "b7"}
    table = DeltaTable(str(tmp_path / "latest"))
    assert table.version() == 1 and table.metadata().partition_columns == ["entity_type"]
    assert table.history(1)[0]["operation"] == "MERGE"
    first = lt.read_latest(tmp_path, version=0)  # time travel: the view before the second run
    assert first["knowledge"].to_list() == [f"a{i}" for i in range(5)]
    assert lt.read_latest(tmp_path).equals(lt.read_latest(tmp_path / "latest"))
    computed = lt.latest_view(store).drop("store")  # the table holds what the stores say, column for column
    assert lt.read_latest(tmp_path).drop("store").equals(computed)


def test_an_older_row_never_replaces_a_newer_one(tmp_path):
    store = tmp_path / "knowledge"
    write(store, [1], "r5", 5, "new")
    update(tmp_path)
    write(store, [1], "r3", 3, "old")  # a row of an earlier run committed late (a resumed old run)
    update(tmp_path)
    assert lt.read_latest(tmp_path)["knowledge"].to_list() == ["new1"]


def test_a_store_that_changed_under_the_marks_rebuilds_the_view(tmp_path, caplog):
    import shutil

    store = tmp_path / "knowledge"
    write(store, range(4), "r1", 1, "a")
    update(tmp_path)
    shutil.rmtree(store)  # rebuilt from scratch: the marks name rows no longer there
    write(store, range(2), "r2", 2, "b")
    assert update(tmp_path) == 2
    assert "rebuilt whole" in caplog.text
    assert lt.read_latest(tmp_path)["knowledge"].to_list() == ["b0", "b1"]


def test_the_earlier_single_file_view_is_removed_and_rebuild_is_a_version(tmp_path):
    (tmp_path / "latest.parquet").write_bytes(b"stale")
    write(tmp_path / "knowledge", range(3), "r1", 1)
    update(tmp_path)
    assert not (tmp_path / "latest.parquet").exists()
    assert update(tmp_path, rebuild=True) == 3
    assert DeltaTable(str(tmp_path / "latest")).version() == 1


def test_missing_view_and_unwritable_scheme_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no latest view"):
        lt.read_latest(tmp_path)
    with pytest.raises(StorageError, match="memory://.*Delta Lake table"):
        lt.delta_target("memory://bucket/job")
    uri, options = lt.delta_target(tmp_path)
    assert uri == str(tmp_path / "latest") and options == {}
