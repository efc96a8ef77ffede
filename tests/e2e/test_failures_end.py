"""Failures end: a one-shot run with failed entities exits 3; scheduled runs give an entity up after
``generation.give_up_after`` identical failures and exit 0; new inputs or another config try it again;
`laser failures` lists them. Tiny random Llama, two tokens a text: every text has fewer words than a
non-degenerate one needs, so ``degenerate=fail`` fails every entity on every run, whatever the batching."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from jobs.cli import app
from jobs.scheduled import run_scheduled
from pipelines.store.knowledge import KnowledgeWriter
from pipelines.store.shards import read_failures
from pipelines.ops.schedule import exitcodes
from pipelines.ops.schedule.failures import failure_table, streaks
from pipelines.ops.schedule.ledger import RunLedger
from test_schedule_incremental import edit_users, incremental_config, write_table_data

FAILING = ("generation.degenerate=fail", "generation.give_up_after=3", "generation.max_new_tokens=2")


def _job(tiny_model, tmp_path, *extra: str):
    data = write_table_data(tmp_path / "data", n_users=4)
    cfg = incremental_config(tiny_model, data, tmp_path / "job", *FAILING, *extra)
    config_file = tmp_path / "job.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return data, cfg, config_file


def _listed(config_file: Path) -> dict[str, tuple[str, int]]:
    """`laser failures CONFIG` as {entity_id: (status, count)}."""
    res = CliRunner().invoke(app, ["failures", str(config_file)])
    assert res.exit_code == 0, res.output
    rows = [line.split("\t") for line in res.stdout.splitlines()[1:] if "\t" in line]
    return {r[1]: (r[2], int(r[3])) for r in rows}


@pytest.mark.slow
def test_one_shot_run_with_failed_entities_exits_3(tiny_model, ray_session, tmp_path):
    _, cfg, config_file = _job(tiny_model, tmp_path)
    res = CliRunner().invoke(app, ["run", str(config_file)])
    assert res.exit_code == exitcodes.PARTIAL, res.output
    [rec] = RunLedger(cfg.output.path).records()
    assert rec.status == "partial" and rec.failed > 0 and rec.given_up == 0
    assert "laser failures" in res.stderr
    listed = _listed(config_file)
    assert len(listed) == rec.failed and set(listed.values()) == {("failed", 1)}
    res = CliRunner().invoke(app, ["failures", str(config_file), "--json"])
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert {r["entity_id"]: (r["status"], r["count"]) for r in rows} == listed and all(r["reason"] for r in rows)
    res = CliRunner().invoke(app, ["runs", str(cfg.output.path), "--json"])
    [run] = [json.loads(line) for line in res.stdout.splitlines()]
    assert run["run_id"] == rec.run_id and run["status"] == "partial" and run["failed"] == rec.failed


@pytest.mark.slow
def test_scheduled_runs_give_up_after_identical_failures(tiny_model, ray_session, tmp_path, capsys):
    data, cfg, config_file = _job(tiny_model, tmp_path)
    store = Path(cfg.output.path) / "knowledge"
    codes = [run_scheduled(cfg) for _ in range(3)]
    recs = RunLedger(cfg.output.path).records()
    failed = recs[0].failed
    assert codes == [exitcodes.PARTIAL] * 3 and failed > 0 and [r.failed for r in recs] == [failed] * 3
    listed = _listed(config_file)
    assert len(listed) == failed and set(listed.values()) == {("failed", 3)}

    lines_before = read_failures(store, unresolved=False, every_line=True).height
    capsys.readouterr()
    assert run_scheduled(cfg) == exitcodes.OK  # the 4th run decodes none of them
    fourth = RunLedger(cfg.output.path).records()[-1]
    assert (fourth.status, fourth.given_up, fourth.failed, fourth.generated) == ("succeeded", failed, 0, 0)
    assert f"given up {failed};" in capsys.readouterr().out
    lines = read_failures(store, unresolved=False, every_line=True)
    recorded = lines.slice(lines_before)
    assert recorded.height == failed and recorded["given_up"].all() and set(recorded["count"]) == {3}
    assert set(recorded["run_id"]) == {fourth.run_id} and recorded["reason"].str.contains("Degenerate").all()
    listed = _listed(config_file)
    assert len(listed) == failed and set(listed.values()) == {("given up", 3)}

    assert run_scheduled(cfg) == exitcodes.OK  # still given up, recorded once
    assert read_failures(store, unresolved=False, every_line=True).height == lines_before + failed

    # new inputs: that user is tried again (its count starts over); the others stay given up
    user = sorted(i for i in listed if i.startswith("u"))[0]
    edit_users(data, [user])
    code = run_scheduled(cfg)
    rec = RunLedger(cfg.output.path).records()[-1]
    assert rec.given_up == failed - 1 and rec.generated + rec.failed == 1
    assert code == (exitcodes.PARTIAL if rec.failed else exitcodes.OK)
    assert _listed(config_file).get(user, ("failed", 1)) == ("failed", 1)  # failed once more, or resolved

    # another generation config: every entity is tried again
    other = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"max_new_tokens": 7})})
    run_scheduled(other)
    assert RunLedger(cfg.output.path).records()[-1].given_up == 0


def test_streaks_read_old_lines_and_reset_on_another_reason(tmp_path):
    old = {"entity_type": "user", "entity_id": "u1", "reason": "ValueError: x", "run_id": "r0", "failed_at": "t"}
    (tmp_path / "failures.jsonl").write_text(json.dumps(old) + "\n")  # a line written before the hashes
    w = KnowledgeWriter(tmp_path, run_id="r1")
    w.note_inputs({("user", "u1"): "h1"}, "c1")
    w.add_failure("user", "u1", "ValueError: x")
    w.add_failure("user", "u1", "ValueError: x")
    w.add_failure("user", "u1", "ValueError: y")  # another reason starts over
    lines = read_failures(tmp_path, every_line=True)
    assert lines.height == 4 and lines["source_hash"].to_list() == [None, "h1", "h1", "h1"]
    s = streaks(lines)[("user", "u1")]
    assert (s.reason, s.source_hash, s.config_hash, s.count, s.given_up) == ("ValueError: y", "h1", "c1", 1, False)
    assert streaks(lines.head(3))[("user", "u1")].count == 2  # the old line (no hash) is not identical
    assert failure_table(tmp_path).select("entity_id", "status", "count").rows() == [("u1", "failed", 1)]
    assert read_failures(tmp_path).select(pl.len()).item() == 1
