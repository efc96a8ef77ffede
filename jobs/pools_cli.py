"""`laser pools build`: a pool store from a team's own texts, for LASER inside the team's own vLLM
(``laser.vllm.request_args(pool=KEY, pool_store=DIR)``). The work is :mod:`pools.from_table`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from pools.from_table import TableBuild

pools_app = typer.Typer(no_args_is_help=True, help="Pool stores for LASER in your own vLLM.")

SHOWN = 10  # pools listed after a build


TableArg = typer.Argument(
    ..., help="A Parquet file, a folder of Parquet files (hive partitions included), or a CSV file or folder."
)
TextColumnOpt = typer.Option(..., "--text-column", help="The column of the texts (one text per row).")
GroupColumnOpt = typer.Option(
    ..., "--group-column", help="The column whose value names a row's pool (its string form is the pool key)."
)
ModelOpt = typer.Option(
    ...,
    "--model",
    help="The model whose tokenizer encodes the texts: the model your vLLM serves, since the engine "
    "refuses a store built with another vocabulary.",
)
OutOpt = typer.Option(..., "--out", help="The pool store's folder (new, empty, or a store it replaces).")
KeyPrefixOpt = typer.Option("", "--key-prefix", help="Put before each group value in the pool key.")
MaxPoolSizeOpt = typer.Option(
    None, "--max-pool-size", min=1, help="At most this many texts per pool (a seeded pick); default: all."
)
SnapshotOpt = typer.Option(
    False, "--snapshot", help="Also build and save each pool's trie, so the engine loads it instead of building it."
)
SeedOpt = typer.Option(0, "--seed", help="Seed of the --max-pool-size pick.")


def build(
    table: Path = TableArg,
    text_column: str = TextColumnOpt,
    group_column: str = GroupColumnOpt,
    model: str = ModelOpt,
    out: Path = OutOpt,
    key_prefix: str = KeyPrefixOpt,
    max_pool_size: Optional[int] = MaxPoolSizeOpt,
    snapshot: bool = SnapshotOpt,
    seed: int = SeedOpt,
) -> None:
    """Build a pool store from TABLE: each group of rows becomes one pool keyed KEY_PREFIX + group value; texts
    are encoded with MODEL's tokenizer without special tokens. Requests draft from a pool with
    laser.vllm.request_args(pool="KEY", pool_store="OUT") (the key as a string). Null or blank texts and rows
    without a group are skipped and counted."""
    import laser
    from pools.from_table import build_from_table, check_out

    try:
        tokenizer = laser.load_tokenizer(model)
        check_out(out)
    except ValueError as exc:  # names the model or the folder
        _refuse(exc)
    make = partial(
        build_from_table,
        table,
        text_column,
        group_column,
        tokenizer,
        out,
        key_prefix=key_prefix,
        max_pool_size=max_pool_size,
        snapshot=snapshot,
        seed=seed,
        meta={"model": model},
    )
    _report(_locked_build(out, make))


def _refuse(exc: Exception) -> NoReturn:
    """One red line naming the bad input, exit 2."""
    typer.secho(str(exc), fg=typer.colors.RED, err=True)
    raise typer.Exit(2) from None


def _locked_build(out: Path, make: Callable[[], TableBuild]) -> TableBuild:
    """``make()`` under the store's lock; a build refused before it wrote anything leaves no folder behind."""
    from pipelines.store.lock import output_lock
    from pools.from_table import TableError

    made = not out.exists()
    try:
        with output_lock(out):  # one build of a store at a time (a second one exits 75 naming the first)
            return make()
    except TableError as exc:
        if made:  # a build refused before it wrote anything leaves no folder behind (only the lock made it)
            (out / ".run.lock").unlink(missing_ok=True)
            with suppress(OSError):  # not empty: a part was written before the error
                out.rmdir()
        _refuse(exc)


def _report(result: TableBuild) -> None:
    """What the build made: its counts, then the first pools and their sizes."""
    typer.echo(
        f"{result.directory}: {len(result.pools)} pools, {result.texts} texts from {result.rows} rows "
        f"(skipped: {result.empty_texts} null or empty texts, {result.no_group} rows without a group; "
        f"{result.capped} over --max-pool-size)"
    )
    for key, n in list(result.pools.items())[:SHOWN]:
        typer.echo(f"{key}\t{n} texts")
    if len(result.pools) > SHOWN:
        typer.echo(f"... and {len(result.pools) - SHOWN} more")


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    pools_app.command("build")(clean_errors(build))
    app.add_typer(pools_app, name="pools")
