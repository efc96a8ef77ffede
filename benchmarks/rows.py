"""Rows of `laser bench engines` that run outside the job, each in a fresh process:

    python -m benchmarks.rows ray-data-llm CONFIG --out DIR [--set k=v ...] [--speculation none|ngram|suffix]

loads the job config (with its overrides) and runs the same work through Ray Data LLM
(:mod:`benchmarks.ray_data_llm`), printing its old and new pass figures as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import typer

from jobs.config import load_config

app = typer.Typer(add_completion=False, no_args_is_help=True)


@app.command("ray-data-llm")
def ray_data_llm(
    config: Path = typer.Argument(..., help="Job config whose entities and prompts are run."),
    out: Path = typer.Option(..., "--out", help="Folder for the summary and the rows."),
    overrides: list[str] = typer.Option([], "--set", help="key.path=value overrides of the config."),
    speculation: str = typer.Option("none", help="vLLM speculation: none, ngram or suffix."),
) -> None:
    from benchmarks.ray_data_llm import SPECULATION, run

    t0 = time.perf_counter()
    if speculation not in SPECULATION:
        raise typer.BadParameter(f"--speculation must be one of {list(SPECULATION)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    summary = run(load_config(config, overrides), out, speculation, t0=t0)
    print(json.dumps({k: summary[k] for k in ("old", "new")}, default=str))


@app.callback()
def _group() -> None:
    """Rows of `laser bench engines` that run outside the job."""


if __name__ == "__main__":
    sys.exit(app())
