"""`laser runs OUT`: the past runs of an output, newest first, from its run ledger (``runs.parquet``)."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

COLUMNS = ("seq", "run_id", "status", "started", "seconds", "decoder", "generated", "failed", "given_up", "error")


def runs(
    out: str = typer.Argument(..., help="The job's output.path: a folder or a URI (s3://...)."),
    last: int = typer.Option(20, "--last", min=1, help="The newest this many runs."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line, one line per run (every field)."),
) -> None:
    """List the past runs of an output from its run ledger: when each started, how long it took, its status
    (running, succeeded, partial, failed), what it generated and what failed."""
    from pipelines.ops.schedule.ledger import RunLedger

    ledger = RunLedger(out)
    try:
        records = sorted(ledger.records(), key=lambda r: (r.seq or 0, r.started), reverse=True)[:last]
    except ValueError as exc:  # an unreadable ledger: the message names it
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if as_json:
        for rec in records:
            typer.echo(json.dumps(asdict(rec), default=str))
        return
    if not records:
        typer.echo(f"{ledger.path}: no runs yet")
        return
    typer.echo("\t".join(COLUMNS))
    for rec in records:
        seconds = f"{(rec.finished - rec.started).total_seconds():.0f}" if rec.finished else "-"
        row = {**asdict(rec), "seconds": seconds, "started": rec.started.isoformat(timespec="seconds")}
        typer.echo("\t".join("" if row[c] is None else str(row[c]) for c in COLUMNS))


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    app.command("runs")(clean_errors(runs))
