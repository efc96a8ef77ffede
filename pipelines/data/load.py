"""`load_dataset`: one entry point from a `DatasetConfig` to canonical tables, with seeded trial limits."""
from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from pipelines.data.config import DatasetConfig
from pipelines.data.schema import Dataset

log = logging.getLogger(__name__)


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the configured dataset in canonical form, then apply ``limit_users``/``limit_items``."""
    ds = _load_full(cfg)
    if cfg.name:
        ds.name = cfg.name
    ds.domain = cfg.resolved_domain()
    ds = limit_dataset(ds, cfg.limit_users, cfg.limit_items, cfg.seed)
    log.info("dataset %s: %d users, %d items, %d interactions", ds.name, ds.users.height, ds.items.height,
             ds.interactions.height)
    return ds


def _load_full(cfg: DatasetConfig) -> Dataset:
    if cfg.format == "synthetic":
        from pipelines.data.synthetic import synthetic_dataset

        return synthetic_dataset(cfg.synthetic, seed=cfg.seed)
    path = Path(cfg.path or "")
    if not path.exists():
        raise FileNotFoundError(f"dataset.path {str(path)!r} (format {cfg.format}) does not exist")
    if cfg.format == "movielens":
        from pipelines.data.movielens import load_movielens

        return load_movielens(path)
    if cfg.format == "amazon":
        from pipelines.data.amazon import load_amazon

        return load_amazon(path, reviews_file=cfg.reviews_file, metadata_file=cfg.metadata_file)
    from pipelines.data.table import load_table

    return load_table(path, cfg)


def limit_dataset(ds: Dataset, limit_users: int | None, limit_items: int | None, seed: int = 0) -> Dataset:
    """Seeded sample for trial runs, keeping only interactions among kept users and kept items.

    Users are drawn uniformly from those with interactions. Items are drawn uniformly from the items
    the kept users interacted with (topped up from the other items when those are too few), so a small
    trial still has histories to work on; with only ``limit_users`` set, the items are those the kept
    users interacted with.
    """
    if limit_users is None and limit_items is None:
        return ds
    inter = ds.interactions
    if limit_users is not None:
        active = inter.select("user_id").unique().sort("user_id")["user_id"]
        if active.len() > limit_users:
            active = active.sample(limit_users, seed=seed)
        inter = inter.filter(pl.col("user_id").is_in(active.implode()))
        users = ds.users.filter(pl.col("user_id").is_in(active.implode()))
    else:
        users = ds.users
    items = ds.items
    if limit_items is not None:
        seen = inter.select("item_id").unique().sort("item_id")["item_id"]
        if seen.len() >= limit_items:
            kept = seen.sample(limit_items, seed=seed)
        else:
            others = items.filter(~pl.col("item_id").is_in(seen.implode())).sort("item_id")["item_id"]
            kept = pl.concat([seen, others.sample(min(limit_items - seen.len(), others.len()), seed=seed)])
        items = items.filter(pl.col("item_id").is_in(kept.implode()))
        inter = inter.filter(pl.col("item_id").is_in(kept.implode()))
    elif limit_users is not None:
        items = items.filter(pl.col("item_id").is_in(inter["item_id"].unique().implode()))
    return Dataset(name=ds.name, domain=ds.domain, interactions=inter, items=items, users=users)
