"""Run lock, run ledger and the scheduler-facing exit codes (no model, no Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.ops.schedule import exitcodes
from pipelines.ops.schedule.ledger import RunLedger, RunRecord
from pipelines.store.lock import LOCK_FILE, LockHeld, RunLock

REPO = Path(__file__).resolve().parents[2]
LASER = [sys.executable, "-c", "from jobs.cli import app; app(prog_name='laser')"]  # this checkout's CLI
HOLD = (
    "import sys, time; from pipelines.store.lock import RunLock; l = RunLock(sys.argv[1], 'holder').acquire();"
    " print('held', flush=True); time.sleep(600)"
)


def _hold_in_subprocess(root: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path, run_id="first") as lock:
        assert lock.stale is None
        with pytest.raises(LockHeld) as err:
            RunLock(tmp_path, run_id="second").acquire()
        assert err.value.holder["pid"] == os.getpid() and err.value.holder["run_id"] == "first"
        assert "another run holds" in str(err.value)
    assert (tmp_path / LOCK_FILE).read_text() == ""  # clean release empties the record
    with RunLock(tmp_path) as again:
        assert again.stale is None


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    proc = _hold_in_subprocess(tmp_path)
    try:
        with pytest.raises(LockHeld):
            RunLock(tmp_path).acquire()  # the holder is alive: refused
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with RunLock(tmp_path, run_id="next") as lock:  # the kernel dropped the dead holder's flock
        assert lock.stale is not None and lock.stale["pid"] == proc.pid and lock.stale["run_id"] == "holder"
        assert json.loads((tmp_path / LOCK_FILE).read_text())["run_id"] == "next"


def test_cli_exits_with_lock_code_while_another_run_holds_the_output(tmp_path):
    out = tmp_path / "job"
    proc = _hold_in_subprocess(out)
    try:
        res = subprocess.run(
            [*LASER, "run", "jobs/configs/demo.yaml", "--incremental", "--set", f"output.path={out}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert res.returncode == exitcodes.LOCKED == 75, res.stderr
    assert "another run holds this output's lock" in res.stderr and str(proc.pid) in res.stderr
    assert not (out / "runs.parquet").exists()  # nothing was done


def test_cli_config_error_exit_code(tmp_path):
    res = subprocess.run(
        [
            *LASER,
            "run",
            "jobs/configs/demo.yaml",
            "--incremental",
            "--set",
            "decoder.nope=1",
            "--set",
            f"output.path={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == exitcodes.CONFIG == 2
    assert "decoder.nope" in res.stderr
    res = subprocess.run(
        [
            *LASER,
            "run",
            "jobs/configs/demo.yaml",
            "--incremental",
            "--set",
            "decoder.params.zz=1",
            "--set",
            f"output.path={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == exitcodes.CONFIG and "decoder.params.zz" in res.stderr
    res = subprocess.run(
        [
            *LASER,
            "run",
            "jobs/configs/demo.yaml",
            "--incremental",
            "--set",
            "dataset.format=table",
            "--set",
            f"dataset.path={tmp_path}/missing.parquet",
            "--set",
            f"output.path={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == exitcodes.CONFIG and "missing.parquet" in res.stderr
    assert RunLedger(tmp_path).records()[-1].status == "failed"  # the ledger says why the run stopped


def test_ledger_records_and_resume_detection(tmp_path):
    ledger = RunLedger(tmp_path)
    assert ledger.records() == [] and ledger.last_succeeded() is None
    a = RunRecord(run_id="a", decoder="laser", config_hash="h", watermark=10, status="succeeded")
    ledger.save(a)
    b = RunRecord(run_id="b", decoder="laser", config_hash="h", previous_watermark=10)
    ledger.save(b)  # running: its driver may have been killed
    assert ledger.unfinished("h").run_id == "b" and ledger.unfinished("other") is None
    assert ledger.last_succeeded().run_id == "a"
    b.status, b.watermark, b.generated = "partial", 12, 3
    ledger.save(b)  # replaced by run_id, not appended
    recs = ledger.records()
    assert [r.run_id for r in recs] == ["a", "b"] and recs[1].generated == 3
    assert ledger.last_succeeded().watermark == 12 and ledger.unfinished("h") is None
    (tmp_path / "runs.parquet").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="runs.parquet: unreadable run ledger"):
        ledger.records()


# ---- every writer takes the lock; the lock file is never followed or shown (issue 23, items 1 and 3) ----


@pytest.mark.parametrize("command", [["run"], ["latest"], ["encode"], ["route"], ["build-pools"], ["generate"]])
def test_every_writer_exits_75_while_another_run_holds_the_output(command, tmp_path):
    from typer.testing import CliRunner

    from jobs.cli import app

    out = tmp_path / "job"
    proc = _hold_in_subprocess(out)
    try:
        res = CliRunner().invoke(
            app,
            [
                *command,
                "jobs/configs/demo.yaml",
                "--set",
                f"output.path={out}",
                "--set",
                "dataset.synthetic.n_users=20",
                "--set",
                "dataset.synthetic.n_items=20",
            ],
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert res.exit_code == exitcodes.LOCKED, res.output
    assert "another run holds this output's lock" in res.output and str(proc.pid) in res.output
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing else was written


def test_output_lock_is_reentrant_in_one_process_and_exclusive_across(tmp_path):
    from pipelines.store.lock import output_lock

    with output_lock(tmp_path, "outer") as outer:
        with output_lock(tmp_path, "inner") as inner:  # a writer called by a writer (ingest -> encode)
            assert inner is outer
        with pytest.raises(LockHeld):
            RunLock(tmp_path, "other").acquire()  # still held after the inner block
    with output_lock(tmp_path, "again"):
        pass


def test_lock_never_follows_a_symlink_nor_shows_what_it_points_to(tmp_path, caplog):
    from pipelines.store.lock import LockError

    secret = tmp_path / "token"
    secret.write_text("s3cr3t-token-value")
    out = tmp_path / "job"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(secret)
    with pytest.raises(LockError, match="symbolic link") as err:
        RunLock(out).acquire()
    assert secret.read_text() == "s3cr3t-token-value"  # not truncated
    assert "s3cr3t" not in str(err.value) + caplog.text


def test_stale_lock_warning_shows_record_fields_only(tmp_path, caplog):
    (tmp_path / LOCK_FILE).write_text("s3cr3t-token-value")  # not a lock record
    with caplog.at_level("WARNING"), RunLock(tmp_path, run_id="next") as lock:
        assert lock.stale == {"unreadable": True}
    assert "stale lock" in caplog.text and "s3cr3t" not in caplog.text
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 7, "run_id": "r", "token": "s3cr3t"}))
    with caplog.at_level("WARNING"), RunLock(tmp_path, run_id="next"):
        pass
    assert "pid" in caplog.text and "s3cr3t" not in caplog.text


def test_resumed_run_counts_its_whole_work():
    """A run killed after writing some entities, then resumed under the same run_id: its new / changed
    counts cover every entity it handles, and only the rest is generated (issue 23, item 9)."""
    from datetime import datetime, timedelta, timezone

    import polars as pl

    from pipelines.workers import GenerationRequest
    from pipelines.knowledge.plan import plan_changes

    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    rows = pl.DataFrame(
        {
            "entity_type": ["user"] * 4,
            "entity_id": ["a", "b", "c", "b"],
            "source_hash": ["ha", "old", "hc", "hb"],
            "config_hash": ["c"] * 4,
            "knowledge": ["t"] * 4,
            "run_id": ["r0", "r0", "r0", "r1"],
            "run_seq": [0, 0, 0, 1],
            "generated_at": [t0, t0, t0, t0 + timedelta(hours=1)],
        }
    )
    requests = [
        GenerationRequest("user", i, source_hash=h) for i, h in (("a", "ha"), ("b", "hb"), ("c", "new"), ("d", "hd"))
    ]
    plan = plan_changes(requests, rows, "c", resuming="r1")  # r1 wrote b before it was killed
    assert (plan.new, plan.changed, plan.unchanged, plan.resumed) == (1, 2, 1, 1)
    assert [r.entity_id for r in plan.todo] == ["c", "d"]
    fresh = plan_changes(requests, rows, "c")  # another run sees r1's row for b as its base
    assert (fresh.new, fresh.changed, fresh.unchanged, fresh.resumed) == (1, 1, 2, 0)
