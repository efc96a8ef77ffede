"""The `laser` command line. Each sub-command lives in the module that owns its work."""
from __future__ import annotations

import logging

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="LASER: fast LLM knowledge generation for recommenders.")


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")


from jobs import run as _job_commands  # noqa: E402  (run, demo, route, build-pools, generate, submit)

_job_commands.register(app)

from jobs.ctr_eval import ctr_eval as _ctr_eval  # noqa: E402

app.command("ctr-eval")(_ctr_eval)
