"""`laser latest`, `laser encode` and `laser ingest feast`: the job's knowledge as features."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt, _load

EncoderOpt = typer.Option("all-minilm-l6-v2", "--encoder", help="Packaged encoder name or local encoder folder.")

ingest_app = typer.Typer(no_args_is_help=True, help="Load the job's knowledge into a feature store.")


def latest(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt) -> None:
    """Rebuild the latest view whole (<output>/latest/, a Delta table; as a new version): one row per entity,
    its newest knowledge."""
    from pipelines.knowledge.paths import JobPaths
    from pipelines.store.lock import output_lock
    from pipelines.ops.schedule.latest import LATEST_TABLE, update_latest

    paths = JobPaths.of(_load(config, set_))
    if not paths.root.exists():
        raise FileNotFoundError(f"{paths.root}: no job output here; run `laser run CONFIG` first")
    with output_lock(paths.root, run_id="latest"):
        entities = update_latest(paths.root, paths.knowledge, paths.old_knowledge, run_id="latest", rebuild=True)
        typer.echo(f"{paths.root / LATEST_TABLE}: {entities} entities")


def _local_output(config: Path, set_: Optional[list[str]], command: str) -> str:
    """The job's output.path as a local path (``file://`` URIs too); exit 2 on an object store URI (the feature
    tables and Feast's file offline store are local)."""
    from pipelines.store.location import Location

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


def ingest_feast(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    encoder: str = EncoderOpt,
    repo: Optional[Path] = typer.Option(
        None,
        "--repo",
        help=(
            "Your own Feast repository (its feature_store.yaml: any online store): register the knowledge views "
            "there and push the new rows to its online store. Default: a demo repository in <output>/feast."
        ),
    ),
) -> None:
    """Encode the latest view, then: with --repo, register the knowledge features in your Feast repository and push
    the rows new since the last push to its online store; without, write the demo repository <output>/feast (SQLite
    online store), apply it and materialize."""
    output = _local_output(config, set_, "ingest feast")
    if repo is not None:
        from pipelines.ops.features.team_repo import RepoError, ingest_into

        try:
            pushed = ingest_into(repo, output, encoder)
        except RepoError as exc:
            typer.secho(str(exc), fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None
        typer.echo(f"{repo.resolve()}: pushed " + ", ".join(f"{n} {view}" for view, n in pushed.items()))
        return
    from pipelines.ops.features.feast_repo import ingest

    demo, done = ingest(output, encoder)
    typer.echo(f"feast repository {demo.path}: " + ", ".join(f"{v} {k}" for k, v in done.items()))


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    app.command("latest")(clean_errors(latest))
    app.command("encode")(clean_errors(encode))
    ingest_app.command("feast")(clean_errors(ingest_feast))
    app.add_typer(ingest_app, name="ingest")
