"""The `laser` command line. Each sub-command lives in the module that owns its work."""
from __future__ import annotations

import logging
import os
import sys

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="LASER: fast LLM knowledge generation for recommenders.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"laser {version('laser-knowledge')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("laser (laser-knowledge not installed)")
        raise typer.Exit()


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
         version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the laser-knowledge version and exit.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not sys.stderr.isatty():  # a log file or a pipe gets a progress line every 30 s, not every update
        os.environ.setdefault("TQDM_MININTERVAL", "30")


@app.command("decoders")
def decoders() -> None:
    """List the registered decoders (built-ins and `laser.decoders` entry-point plug-ins)."""
    from laser import available_decoders

    for name, cls in available_decoders().items():
        typer.echo(f"{name:16s} pool={cls.pool:7s} {cls.summary}")


from jobs import run as _job_commands  # noqa: E402  (run, demo, route, build-pools, generate, submit)

_job_commands.register(app)

from jobs import features as _feature_commands  # noqa: E402  (latest, encode, ingest feast)

_feature_commands.register(app)

from jobs import recommend as _recommend_commands  # noqa: E402  (recommend)

_recommend_commands.register(app)

from jobs import failures as _failure_commands  # noqa: E402  (failures)

_failure_commands.register(app)

from jobs.ctr_eval import ctr_eval as _ctr_eval  # noqa: E402

app.command("ctr-eval")(_ctr_eval)

from training.cli import register as _register_training  # noqa: E402

_register_training(app)

from benchmarks.cli import register as _register_benchmarks  # noqa: E402

_register_benchmarks(app)


if __name__ == "__main__":
    app()
