"""Bad input through the command line, before any model loads: a bad data row is skipped (the job goes on), a
torn knowledge manifest is rebuilt, and writers wait their turn on a shared store (exit 75)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pipelines.workers import encode_params
from pipelines.store.knowledge import KnowledgeWriter, read_knowledge
from pipelines.store.lock import RunLock

SMALL = ["--set", "dataset.synthetic.n_users=12", "--set", "dataset.synthetic.n_items=16"]


def _table(tmp_path, items: str) -> list[str]:
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"u{u},i{(u * 3 + k) % 8},{1 + (u + k) % 5},{100 * u + k}" for u in range(8) for k in range(5)]
    (data / "inter.csv").write_text("user_id,item_id,rating,timestamp\n" + "\n".join(rows) + "\n")
    (data / "items.csv").write_text(items)
    return [
        "--set",
        "dataset.format=table",
        "--set",
        f"dataset.path={data}",
        "--set",
        "dataset.interactions_file=inter.csv",
        "--set",
        "dataset.items_file=items.csv",
        "--set",
        f"output.path={tmp_path / 'out'}",
        "--set",
        "routing.lightgcn={max_epochs: 2}",
    ]


ITEMS = "item_id,title,genres\n" + "".join(f"i{k},Film {k},{'Drama' if k % 2 else 'Comedy'}\n" for k in range(8))


def test_an_item_row_with_an_empty_id_is_skipped_and_the_route_goes_on(tmp_path):
    args = _table(tmp_path, ITEMS + ",Nobody,Drama\n")  # once: ValueError '1 items have no attribute group: ['None']'
    result = CliRunner().invoke(app, ["route", "jobs/configs/demo.yaml", *args])
    assert result.exit_code == 0, result.output
    assert "None" not in result.output and "item" in result.output


def test_no_usable_item_id_is_one_line_naming_file_and_column(tmp_path):
    args = _table(tmp_path, "item_id,title\n,A\n,B\n")
    result = CliRunner().invoke(app, ["run", "jobs/configs/demo.yaml", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "items.csv: column 'item_id': 2 of 2 rows have no item_id" in result.output


def _knowledge(store, n: int) -> None:
    with KnowledgeWriter(store, shard_rows=2, run_id="earlier") as w:
        for i in range(n):
            w.add(
                {
                    "entity_type": "item",
                    "entity_id": f"i{i}",
                    "knowledge": f"item {i} is a film",
                    "model": "m",
                    "decoder": "resd",
                    "decoder_params": encode_params({}),
                    "prompt_version": "v",
                    "pool_kind": None,
                    "group_id": None,
                    "n_tokens": 5,
                    "target_forwards": 5,
                    "accepted_tokens": 0,
                    "retrieval_s": 0.0,
                    "generation_s": 0.1,
                    "finish_reason": "eos",
                    "run_id": "earlier",
                    "generated_at": datetime(2024, 1, 1, tzinfo=timezone.utc),
                }
            )


class Stop(Exception):
    """Raised where the job would start its model workers: what came before is what is checked."""


@pytest.mark.parametrize("incremental", [False, True])
def test_run_rebuilds_a_torn_manifest_instead_of_dying(tmp_path, monkeypatch, incremental):
    out = tmp_path / "out"
    _knowledge(out / "knowledge", 5)
    (out / "knowledge" / "manifest.json").write_text('{"shards": [')
    result = CliRunner().invoke(app, ["latest", "jobs/configs/demo.yaml", "--set", f"output.path={out}", *SMALL])
    assert result.exit_code == 0 and "5 entities" in result.output, result.output  # a reader: rebuilt in memory

    def stop(*args, **kwargs):
        raise Stop()

    monkeypatch.setattr("pipelines.knowledge.job.worker_group", stop)
    args = ["run", "jobs/configs/demo.yaml", "--set", f"output.path={out}", *SMALL] + (["--incremental"] * incremental)
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, Stop) or result.exit_code != 0, result.output  # it got as far as the model
    shards = json.loads((out / "knowledge" / "manifest.json").read_text())["shards"]
    assert [s["rows"] for s in shards] == [2, 2, 1] and all(len(s["sha256"]) == 64 for s in shards)
    assert read_knowledge(out / "knowledge").height == 5


def test_a_shared_old_knowledge_store_is_written_by_one_job_at_a_time(tmp_path):
    shared = tmp_path / "shared_old"
    _knowledge(shared, 2)
    args = [
        "run",
        "jobs/configs/demo.yaml",
        "--set",
        f"output.path={tmp_path / 'out'}",
        "--set",
        f"old_knowledge.path={shared}",
        *SMALL,
    ]
    with RunLock(shared, run_id="another job"):  # another job writes the shared store now
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 75, result.output
    assert f"{shared}/.run.lock: another run holds" in result.output and "Traceback" not in result.output


def test_recommend_writes_under_the_output_lock(tmp_path):
    out = tmp_path / "out"
    with RunLock(out, run_id="laser run"):
        result = CliRunner().invoke(
            app,
            [
                "recommend",
                "jobs/configs/demo.yaml",
                "--set",
                f"output.path={out}",
                "--set",
                "decoder.name=beam",
                "--set",
                "decoder.params={}",
                *SMALL,
            ],
        )
    assert result.exit_code == 75, result.output
    assert "another run holds this output's lock" in result.output
    assert not (out / "recommendations").exists() and not (out / "recommend_eval.json").exists()
