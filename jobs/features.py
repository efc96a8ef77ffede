"""`laser latest`, `laser encode` and `laser ingest feast`: the job's knowledge as features."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt, _load

EncoderOpt = typer.Option("all-minilm-l6-v2", "--encoder", help="Packaged encoder name or local encoder folder.")

ingest_app = typer.Typer(no_args_is_help=True, help="Load the job's knowledge into a feature store.")


def latest(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt) -> None:
    """Rebuild <output>/latest.parquet: one row per entity, its newest knowledge."""
    from pipelines.knowledge.paths import JobPaths
    from pipelines.lock import output_lock
    from pipelines.ops.schedule.latest import LATEST_FILE, latest_view, write_latest

    paths = JobPaths.of(_load(config, set_))
    if not paths.root.exists():
        raise FileNotFoundError(f"{paths.root}: no job output here; run `laser run CONFIG` first")
    with output_lock(paths.root, run_id="latest"):
        view = latest_view(paths.knowledge, paths.old_knowledge)
        typer.echo(f"{write_latest(paths.root / LATEST_FILE, view)}: {view.height} entities")


def _local_output(config: Path, set_: Optional[list[str]], command: str) -> str:
    """The job's output.path as a local path (``file://`` URIs too); exit 2 on an object store URI (the feature
    tables and Feast's file offline store are local)."""
    from pipelines.storage import Location

    path = _load(config, set_).output.path
    location = Location.of(path)
    if not location.local:
        typer.secho(
            f"laser {command}: output.path {path!r} is not on a local file system; the feature tables "
            "and the Feast repository need a local output.path",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(2)
    return location.path


def encode(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt, encoder: str = EncoderOpt) -> None:
    """Encode the latest view's knowledge into <output>/features/{user,item}_knowledge.parquet."""
    from pipelines.ops.features.encode import encode_latest

    tables = encode_latest(_local_output(config, set_, "encode"), encoder)
    typer.echo(f"{tables.root}: vectors of dim {tables.dim}")


def ingest_feast(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt, encoder: str = EncoderOpt) -> None:
    """Encode, write the Feast repository <output>/feast, apply it and materialize into its SQLite online store."""
    from pipelines.ops.features.feast_repo import ingest

    repo, done = ingest(_local_output(config, set_, "ingest feast"), encoder)
    typer.echo(f"feast repository {repo.path}: " + ", ".join(f"{v} {k}" for k, v in done.items()))


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    app.command("latest")(clean_errors(latest))
    app.command("encode")(clean_errors(encode))
    ingest_app.command("feast")(clean_errors(ingest_feast))
    app.add_typer(ingest_app, name="ingest")
