"""`laser recommend CONFIG`: the generative recommendation job (see pipelines/recommend/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt


def recommend(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt) -> None:
    """Top-K next items for every user with a new history (beam search over item identifiers), written as
    recommendation Parquet, then recall@K and NDCG@K against the held-out new history."""
    from jobs.config import ConfigError, load_config
    from pipelines.recommend.config import RecommendJobConfig
    from pipelines.recommend.job import print_recommend_summary, run_recommend_job

    try:
        cfg = load_config(config, set_ or [], schema=RecommendJobConfig)
    except ConfigError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    print_recommend_summary(run_recommend_job(cfg))


def register(app: typer.Typer) -> None:
    from jobs.errors import clean_errors

    app.command("recommend")(clean_errors(recommend))
