"""The job's inputs: the configured dataset and its seeded old/new split."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipelines.config import JobConfig
from pipelines.data import Dataset, Split
from pipelines.data.load import load_dataset
from pipelines.data.split import split_old_new
from pipelines.prompts.template import check_columns, load_template

log = logging.getLogger(__name__)


@dataclass
class JobData:
    """The loaded dataset and its old/new split."""

    dataset: Dataset
    split: Split


def load_job_data(cfg: JobConfig, mode: str | None = None) -> JobData:
    """Load the configured dataset and split it (``split.mode``, or ``mode``: the recommendation job and the
    research tools hold out new behaviour, so they split as the paper does)."""
    ds = load_dataset(cfg.dataset)
    prompts = load_template(cfg.prompts.template, ds.domain, cfg.prompts.system)
    check_columns(prompts, ds.items.columns, ds.users.columns)  # a column the template names: before generation
    sp = cfg.split if mode is None else cfg.split.model_copy(update={"mode": mode})
    split = split_old_new(
        ds,
        seed=cfg.dataset.seed,
        max_hist=sp.max_hist,
        new_item_fraction=sp.new_item_fraction,
        new_count=sp.new_count,
        mode=sp.mode,
    )
    log.info(
        "split (%s): %d old / %d new interactions, %d existing / %d new items",
        sp.mode,
        split.old_interactions.height,
        split.new_interactions.height,
        split.existing_items.height,
        split.new_items.height,
    )
    return JobData(ds, split)
