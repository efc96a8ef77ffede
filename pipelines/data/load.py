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
    ds = check_interactions(_load_full(cfg), cfg.rating_scale)
    if cfg.name:
        ds.name = cfg.name
    ds.domain = cfg.resolved_domain()
    ds = limit_dataset(ds, cfg.limit_users, cfg.limit_items, cfg.seed)
    log.info("dataset %s: %d users, %d items, %d interactions", ds.name, ds.users.height, ds.items.height,
             ds.interactions.height)
    return ds


SHOWN_ROWS = 5


def check_interactions(ds: Dataset, scale: tuple[float, float] | None = None) -> Dataset:
    """Documented rules on every loader's interactions, each counted in ``ds.notes`` with its first rows:
    ratings that are NaN, infinite, negative or outside ``scale`` are skipped; of several rows for one
    (user, item) the newest is kept (equal timestamps: the later row in the file)."""
    inter, notes = ds.interactions, dict(ds.notes)
    rating = pl.col("rating")
    bad = rating.is_nan() | rating.is_infinite() | (rating < 0)
    if scale is not None:
        bad = bad | (rating < scale[0]) | (rating > scale[1])
    invalid = inter.filter(bad)
    what = "NaN, infinite or negative" + (f", or outside dataset.rating_scale [{scale[0]}, {scale[1]}]" if scale else "")
    _note_rows(notes, ds.name, f"interactions with invalid ratings ({what}), skipped", invalid)
    inter = inter.filter(~bad)
    newest = inter.unique(subset=["user_id", "item_id"], keep="last", maintain_order=True)  # sorted by time
    if newest.height < inter.height:
        superseded = inter.join(newest, on=list(inter.columns), how="anti", nulls_equal=True)
        _note_rows(notes, ds.name, "duplicate (user, item) interactions: the newest kept (equal timestamps: the "
                   "later row), older rows skipped", superseded)
        inter = newest
    return Dataset(name=ds.name, domain=ds.domain, interactions=inter, items=ds.items, users=ds.users, notes=notes)


def _note_rows(notes: dict, source: str, what: str, rows: pl.DataFrame) -> None:
    if rows.is_empty():
        return
    shown = [f"user {u} item {i} rating {r} time {t}" for u, i, r, t in
             rows.select("user_id", "item_id", "rating", "timestamp").head(SHOWN_ROWS).iter_rows()]
    notes[what] = {"count": rows.height, "first": shown}
    log.warning("%s: %s: %d row(s), first: %s", source, what, rows.height, "; ".join(shown))


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
    """Seeded sample for trial runs that keeps the kept users' histories as whole as it can.

    Users are drawn uniformly (seeded) from those with interactions. Items are the ``limit_items`` items
    the kept users rated most (ties by item id), topped up with a seeded draw from the other items when
    they rated fewer; only interactions among kept users and items remain. With only ``limit_users``
    the items are those the kept users interacted with. What the sample dropped (interactions of kept
    users, kept users left without any interaction) is logged and kept in ``ds.notes``.
    """
    if limit_users is None and limit_items is None:
        return ds
    inter, users, items = ds.interactions, ds.users, ds.items
    if limit_users is not None:
        active = inter.select("user_id").unique().sort("user_id")["user_id"]
        if active.len() > limit_users:
            active = active.sample(limit_users, seed=seed)
        inter = inter.filter(pl.col("user_id").is_in(active.implode()))
        users = users.filter(pl.col("user_id").is_in(active.implode()))
    before = inter
    if limit_items is not None:
        kept = _most_rated_items(inter, items, limit_items, seed)
        items = items.filter(pl.col("item_id").is_in(kept.implode()))
        inter = inter.filter(pl.col("item_id").is_in(kept.implode()))
    elif limit_users is not None:
        items = items.filter(pl.col("item_id").is_in(inter["item_id"].unique().implode()))
    notes = dict(ds.notes)
    notes["sample_dropped_interactions"] = before.height - inter.height
    emptied = sorted(set(before["user_id"]) - set(inter["user_id"]))
    notes["sample_users_without_interactions"] = len(emptied)
    log.info("trial sample: %d users, %d items; kept %d of the kept users' %d interactions (dropped %d with items "
             "outside the sample); %d kept users have no interaction left%s", users.height, items.height,
             inter.height, before.height, before.height - inter.height, len(emptied),
             f" (e.g. {emptied[:5]})" if emptied else "")
    return Dataset(name=ds.name, domain=ds.domain, interactions=inter, items=items, users=users, notes=notes)


def _most_rated_items(inter: pl.DataFrame, items: pl.DataFrame, limit: int, seed: int) -> pl.Series:
    """The ``limit`` items with most interactions in ``inter`` (ties by id), topped up from the rest."""
    counts = inter.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])
    kept = counts["item_id"].head(limit)
    if kept.len() < limit:
        others = items.filter(~pl.col("item_id").is_in(kept.implode())).sort("item_id")["item_id"]
        kept = pl.concat([kept, others.sample(min(limit - kept.len(), others.len()), seed=seed)])
    return kept
