"""`laser runs OUT`: an output's past runs from its ledger, newest first, as a table or JSON lines."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner

from jobs.cli import app
from pipelines.ops.schedule.ledger import LEDGER_FILE, RunLedger, RunRecord

T0 = datetime(2026, 11, 1, 2, 30, tzinfo=timezone.utc)


def _ledger(out) -> list[RunRecord]:
    ledger = RunLedger(out)
    records = [
        RunRecord(f"r{i}", "laser", "h", started=T0 + timedelta(days=i), seq=i, generated=10 * i) for i in range(1, 4)
    ]
    records[0].finished, records[0].status = T0 + timedelta(days=1, seconds=95), "succeeded"
    records[1].finished, records[1].status, records[1].failed = T0 + timedelta(days=2, seconds=80), "partial", 2
    for rec in records:  # the third is still running
        ledger.save(rec)
    return records


def test_runs_lists_the_newest_first_with_their_figures(tmp_path):
    _ledger(tmp_path)
    res = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert res.exit_code == 0, res.output
    header, *rows = [line.split("\t") for line in res.stdout.splitlines()]
    assert header[:5] == ["seq", "run_id", "status", "started", "seconds"]
    assert [r[1] for r in rows] == ["r3", "r2", "r1"]
    assert rows[0][2:5] == ["running", "2026-11-04T02:30:00+00:00", "-"] and rows[1][2] == "partial"
    assert rows[2][4] == "95" and rows[1][7] == "2"  # seconds of a finished run, failed entities
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--json", "--last", "2"])
    runs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["run_id"] for r in runs] == ["r3", "r2"] and runs[1]["failed"] == 2 and "config_hash" in runs[0]


def test_runs_of_an_output_without_runs_or_with_a_broken_ledger(tmp_path):
    res = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert res.exit_code == 0 and "no runs yet" in res.stdout
    (tmp_path / LEDGER_FILE).write_text("not parquet")
    res = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert res.exit_code == 2 and "unreadable run ledger" in res.output and "Traceback" not in res.output


def test_laser_demo_reaches_the_job(monkeypatch):
    """`laser demo` calls `run` with every option given (an option left out is typer's default object, truthy)."""
    import pipelines.knowledge.job as job

    class Reached(Exception):
        pass

    def run_job(cfg, incremental=False, keep_existing=False):
        raise Reached(cfg.output.path)

    monkeypatch.setattr(job, "run_job", run_job)
    res = CliRunner().invoke(app, ["demo"])
    assert isinstance(res.exception, Reached), res.output
