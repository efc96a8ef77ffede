"""`laser run CONFIG --incremental`: one scheduled run, with exit codes a scheduler can act on.

Exit codes (``pipelines.ops.schedule.exitcodes``): 0 done; 1 unexpected error; 2 invalid config or input
data; 3 finished with failed entities (retried by the next run); 75 another run holds the output's lock.
Workers whose engine cannot start or cannot run the model end the run with one line and exit 1.
Entities given up on after ``generation.give_up_after`` identical failures are not retried: they leave 0.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import typer

from pipelines.config import JobConfig
from pipelines.ops.schedule import exitcodes

if TYPE_CHECKING:
    from pipelines.knowledge.summary import JobSummary
    from pipelines.ops.schedule.ledger import RunRecord

log = logging.getLogger(__name__)


def run_record(summary: JobSummary) -> RunRecord:
    """The run's ledger row, which ``run_job`` always sets (a summary without one is a bug, said so)."""
    if summary.record is None:
        raise RuntimeError(f"run {summary.run_id}: the job ended without its ledger record")
    return summary.record


def run_scheduled(cfg: JobConfig, keep_existing: bool = False) -> int:
    """Run once incrementally; print the closing summary and a one-line result; return the exit code."""
    from pipelines.data.readers import DataFileError
    from jobs.errors import os_error_line
    from pipelines.knowledge.job import check_job, run_job
    from pipelines.knowledge.plan import exit_code
    from pipelines.knowledge.summary import print_summary
    from pipelines.knowledge.validation import JobInputError
    from pipelines.store.lock import LockError, LockHeld
    from pipelines.workers import EngineUnusable

    try:  # configuration errors first, before the lock and hours of work
        check_job(cfg)
    except ValueError as exc:
        typer.secho(f"laser: {exc}", fg=typer.colors.RED, err=True)
        return exitcodes.CONFIG
    try:
        summary = run_job(cfg, incremental=True, keep_existing=keep_existing)
    except LockHeld as exc:
        typer.secho(str(exc), fg=typer.colors.YELLOW, err=True)
        return exitcodes.LOCKED
    except (DataFileError, JobInputError, LockError) as exc:  # input data unreadable, a planted lock file: names it
        typer.secho(f"laser: {exc}", fg=typer.colors.RED, err=True)
        return exitcodes.CONFIG
    except OSError as exc:  # a wrong path (2), a read-only folder, a full disk (1): one line naming the path
        log.debug("OS error", exc_info=True)
        line, code = os_error_line(exc)
        typer.secho(f"laser: {line}", fg=typer.colors.RED, err=True)
        return code
    except EngineUnusable as exc:  # the engine cannot start or cannot run the model: its error, no traceback
        typer.secho(f"laser: {exc}", fg=typer.colors.RED, err=True)
        return exitcodes.ERROR
    except Exception as exc:  # noqa: BLE001  (the ledger row says failed; the scheduler sees 1)
        log.exception("run failed")
        typer.secho(f"laser: run failed: {type(exc).__name__}: {exc}", fg=typer.colors.RED, err=True)
        return exitcodes.ERROR
    print_summary(summary)
    rec = run_record(summary)
    typer.echo(
        f"run {rec.run_id} {rec.status}: {rec.entities_new} new, {rec.entities_changed} changed, "
        f"{rec.entities_unchanged} unchanged; generated {rec.generated}, failed {rec.failed}, "
        f"given up {rec.given_up}; "
        f"watermark {rec.watermark}"
    )
    return exit_code(rec.status)
