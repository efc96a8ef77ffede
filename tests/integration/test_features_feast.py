"""Feast ingestion for real: file offline store, SQLite online store, the packaged MiniLM encoder.

Knowledge rows are written straight into the stores (no LLM needed): a first run, then a later run that
rewrites two entities, as an incremental run does. Nothing is mocked.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl
import pytest

from pipelines.ops.features.encode import encode_latest
from pipelines.ops.features.feast_repo import PROJECT, ingest, online_features
from pipelines.store.knowledge import KnowledgeRow, KnowledgeWriter
from pipelines.store.lock import output_lock
from pipelines.ops.schedule.latest import latest_view, update_latest
from tests.helpers import run_row as _row

pytest.importorskip("feast")

WORDS = ["war", "comedy", "space", "romance", "noir", "heist", "western", "musical", "horror", "family"]


def _write_run(store, rows: list[dict], run_id: str) -> None:
    with KnowledgeWriter(store, shard_rows=4, run_id=run_id) as w:
        for r in rows:
            w.add(r)


def _refresh_latest(out, row_type=KnowledgeRow) -> None:
    with output_lock(out, run_id="test"):
        update_latest(out, out / "knowledge", out / "old_knowledge", row_type=row_type)


def _assert_online_equals_parquet(out, store) -> int:
    checked = 0
    for etype in ("user", "item"):
        table = pl.read_parquet(out / "features" / f"{etype}_knowledge.parquet")
        ids = table[f"{etype}_id"].to_list()
        got = online_features(store, etype, ids)
        assert got["knowledge"] == table["knowledge"].to_list()
        for mine, theirs in zip(table["knowledge_vector"].to_list(), got["knowledge_vector"]):
            assert theirs is not None and np.array_equal(np.asarray(mine, np.float32), np.asarray(theirs, np.float32))
        checked += len(ids)
    return checked


def test_feast_ingest_reads_back_every_entity_then_incremental_changes(tmp_path):
    out = tmp_path / "job"
    users = [f"u{i}" for i in range(12)]
    items = [f"i{i}" for i in range(6)]
    _write_run(
        out / "knowledge",
        [_row("user", u, f"User {u} likes {WORDS[k % 10]} films.", "r1") for k, u in enumerate(users)],
        "r1",
    )
    _write_run(
        out / "old_knowledge",
        [_row("item", i, f"A {WORDS[k % 10]} film called {i}.", "r0", -60) for k, i in enumerate(items)],
        "r0",
    )
    _refresh_latest(out)
    repo, done = ingest(out)
    assert done == {"user_knowledge": "full", "item_knowledge": "full"}
    assert (repo.path / "feature_store.yaml").is_file() and (repo.path / "knowledge_repo.py").is_file()
    store = repo.store()
    assert store.project == PROJECT
    assert _assert_online_equals_parquet(out, store) == len(users) + len(items)  # 100% of entities
    first = pl.read_parquet(out / "features" / "user_knowledge.parquet")
    assert first["knowledge_vector"].list.len().unique().to_list() == [384]

    time.sleep(1.0)  # the next run's rows are generated after the last materialization
    changed = ["u3", "u7"]
    _write_run(
        out / "knowledge", [_row("user", u, f"User {u} now dislikes {u} thrillers.", "r2") for u in changed], "r2"
    )
    _refresh_latest(out)
    repo, done = ingest(out)
    assert done == {"user_knowledge": "incremental", "item_knowledge": "incremental"}
    store = repo.store()
    assert _assert_online_equals_parquet(out, store) == len(users) + len(items)
    got = online_features(store, "user", users, ("knowledge", "run_id"))
    assert {u for u, r in zip(got["user_id"], got["run_id"]) if r == "r2"} == set(changed)
    assert got["knowledge"][users.index("u3")] == "User u3 now dislikes u3 thrillers."
    before = dict(zip(first["user_id"], first["knowledge_vector"].to_list()))
    after = pl.read_parquet(out / "features" / "user_knowledge.parquet")
    moved = {u for u, v in zip(after["user_id"], after["knowledge_vector"].to_list()) if v != before[u]}
    assert moved == set(changed)  # only the changed users got new vectors


def test_encode_requires_a_latest_view(tmp_path):
    with pytest.raises(FileNotFoundError, match="latest: no latest view"):
        encode_latest(tmp_path)


def test_cli_ingest_feast(tmp_path):
    from typer.testing import CliRunner

    from jobs.cli import app

    out = tmp_path / "job"
    _write_run(out / "knowledge", [_row("user", "u1", "Likes noir.", "r1")], "r1")
    res = CliRunner().invoke(app, ["ingest", "feast", "jobs/configs/demo.yaml", "--set", f"output.path={out}"])
    assert res.exit_code == 2 and "no latest view" in res.output  # the latest view not written yet
    assert CliRunner().invoke(app, ["latest", "jobs/configs/demo.yaml", "--set", f"output.path={out}"]).exit_code == 0
    res = CliRunner().invoke(app, ["ingest", "feast", "jobs/configs/demo.yaml", "--set", f"output.path={out}"])
    assert res.exit_code == 0, res.output
    assert "full user_knowledge" in res.output
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(out / "feast"))
    assert online_features(store, "user", ["u1"])["knowledge"] == ["Likes noir."]


def test_feature_store_yaml_quotes_paths_with_hash_and_colon(tmp_path):
    import yaml

    from pipelines.ops.features.encode import FeatureTables
    from pipelines.ops.features.feast_repo import write_repo

    out = tmp_path / "fe #1: x"
    (out / "features").mkdir(parents=True)
    repo = write_repo(out, FeatureTables(out / "features", 4), "enc")
    conf = yaml.safe_load((repo.path / "feature_store.yaml").read_text())
    assert conf["online_store"]["path"] == str(out.resolve() / "feast" / "data" / "online.db")
    assert conf["registry"] == str(out.resolve() / "feast" / "data" / "registry.db")


def test_a_column_added_to_the_row_reaches_the_store_the_latest_view_and_feast(tmp_path):
    """One field added to the row definition (a subclass: the same as adding it to KnowledgeRow) is a shard
    column, a latest-view column and a Feast feature served online, with nothing else edited."""
    from dataclasses import dataclass

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.store.knowledge import column, read_knowledge

    @dataclass(slots=True, kw_only=True)
    class MoodRow(KnowledgeRow):
        mood: str | None = column(pa.string(), "the text's mood", feature=True)

    class MoodWriter(KnowledgeWriter):
        row_type = MoodRow

    out = tmp_path / "job"
    with MoodWriter(out / "knowledge", shard_rows=4, run_id="r1") as w:
        w.add(MoodRow.from_mapping({**_row("user", "u1", "Likes war films.", "r1"), "mood": "grim"}))
        w.add({**_row("item", "i1", "A heist film.", "r1"), "mood": "tense"})
    shard = pq.read_table(next((out / "knowledge").glob("part-*.parquet")))
    assert shard.schema.field("mood").type == pa.string() and shard["mood"].to_pylist() == ["grim", "tense"]
    assert read_knowledge(out / "knowledge", row_type=MoodRow)["mood"].to_list() == ["grim", "tense"]
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['mood'\]"):  # the plain row has no such column
        KnowledgeRow.from_mapping({**_row("user", "u2", "x", "r1"), "mood": "calm"})

    view = latest_view(out / "knowledge", row_type=MoodRow)
    assert dict(zip(view["entity_id"], view["mood"])) == {"u1": "grim", "i1": "tense"}
    _refresh_latest(out, MoodRow)
    repo, _ = ingest(out, row_type=MoodRow)
    assert 'Field(name="mood", dtype=String)' in repo.definitions.read_text()
    store = repo.store()
    assert "mood" in {f.name for f in store.get_feature_view("user_knowledge").features}
    assert online_features(store, "item", ["i1"], ("knowledge", "mood"))["mood"] == ["tense"]
