"""`laser failures CONFIG`: the entities a job could not generate, failed (retried by the next run) or given up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt, _load


def failures(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    old: bool = typer.Option(False, "--old", help="The old-knowledge store's failures instead."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line, one line per entity."),
) -> None:
    """List the entities with unresolved failures: status (failed: the next run retries it; given up: after
    generation.give_up_after identical failures), identical failures in a row, the last run, the reason."""
    from pipelines.knowledge.paths import JobPaths
    from pipelines.ops.schedule.failures import failure_table

    paths = JobPaths.of(_load(config, set_))
    store = paths.old_knowledge if old else paths.knowledge
    table = failure_table(store)
    if as_json:
        for rec in table.iter_rows(named=True):
            typer.echo(json.dumps(rec, default=str))
        return
    if not table.height:
        typer.echo(f"{store}: no unresolved failures")
        return
    typer.echo("entity_type\tentity_id\tstatus\tcount\tlast_run\treason")
    for rec in table.iter_rows(named=True):
        typer.echo(
            f"{rec['entity_type']}\t{rec['entity_id']}\t{rec['status']}\t{rec['count']}\t{rec['last_run']}\t"
            f"{rec['reason']}"
        )
    given_up = int((table["status"] == "given up").sum())
    typer.echo(f"{table.height} entities: {table.height - given_up} failed, {given_up} given up", err=True)


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    app.command("failures")(clean_errors(failures))
