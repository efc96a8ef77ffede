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
    ds = limit_dataset(ds, cfg.limit_users, cfg.limit_items, cfg.seed, cfg.sample_items)
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


def limit_dataset(ds: Dataset, limit_users: int | None, limit_items: int | None, seed: int = 0,
                  sample_items: str = "whole_histories") -> Dataset:
    """Seeded sample for trial runs that keeps WHOLE histories: the users it picks with every interaction
    they have, and the items they touched (``sample_items="most_rated"``: see :func:`_most_rated_sample`).

    Users with interactions are visited in a seeded random order and kept until ``limit_users`` are kept;
    with ``limit_items``, a user whose history would take the kept items past ``limit_items`` is passed
    over (never cut), except the first one, kept whole even when its history alone is larger (with a
    warning). The items table holds exactly the items the kept users touched. ``ds.notes`` says how much of
    the data the sample kept (users, items, interactions: "k of n (share)") and how many users were passed
    over for the item limit; the same is logged.
    """
    if limit_users is None and limit_items is None:
        return ds
    if sample_items == "most_rated":
        return _most_rated_sample(ds, limit_users, limit_items, seed)
    if sample_items != "whole_histories":
        raise ValueError(f"sample_items must be 'whole_histories' or 'most_rated', got {sample_items!r}")
    inter = ds.interactions
    per_user = inter.group_by("user_id").agg(pl.col("item_id").unique()).sort("user_id")
    order = per_user.sample(fraction=1.0, shuffle=True, seed=seed)
    kept_users: list[str] = []
    kept_items: set[str] = set()
    passed_over = 0
    for uid, its in order.iter_rows():
        if limit_users is not None and len(kept_users) >= limit_users:
            break
        union = kept_items | set(its)
        if limit_items is not None and kept_users and len(union) > limit_items:
            passed_over += 1
            continue
        kept_users.append(uid)
        kept_items = union
    if limit_items is not None and len(kept_items) > limit_items:
        log.warning("trial sample: user %s alone rated %d items, more than limit_items=%d; kept whole (raise "
                    "limit_items to sample more users)", kept_users[0], len(kept_items), limit_items)
    users_kept = pl.Series(kept_users, dtype=pl.Utf8).implode()
    small = inter.filter(pl.col("user_id").is_in(users_kept))
    items = ds.items.filter(pl.col("item_id").is_in(pl.Series(sorted(kept_items), dtype=pl.Utf8).implode()))
    users = ds.users.filter(pl.col("user_id").is_in(users_kept))
    notes = dict(ds.notes)
    notes.update(sample_notes(ds, small, items, users, passed_over))
    log.info("trial sample kept %s users, %s items, %s interactions (whole histories)%s",
             notes["sample_kept_users"], notes["sample_kept_items"], notes["sample_kept_interactions"],
             f"; {passed_over} users passed over: their history would exceed limit_items={limit_items}"
             if passed_over else "")
    return Dataset(name=ds.name, domain=ds.domain, interactions=small, items=items, users=users, notes=notes)


def _most_rated_sample(ds: Dataset, limit_users: int | None, limit_items: int | None, seed: int) -> Dataset:
    """``sample_items="most_rated"``: ``limit_users`` users in the same seeded order as the whole-history
    sample (none passed over), then the ``limit_items`` items they rated most (ties by item id); only
    interactions among kept users and kept items remain. Users left without any interaction are dropped.
    The notes count the kept users' interactions dropped and the users emptied (``sample_*``)."""
    inter = ds.interactions
    order = inter.group_by("user_id").agg(pl.len()).sort("user_id").sample(fraction=1.0, shuffle=True, seed=seed)
    picked = order["user_id"].to_list()[:limit_users] if limit_users is not None else order["user_id"].to_list()
    before = inter.filter(pl.col("user_id").is_in(pl.Series(picked, dtype=pl.Utf8).implode()))
    if limit_items is not None:
        counts = before.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])
        kept_items = counts["item_id"].head(limit_items)
        small = before.filter(pl.col("item_id").is_in(kept_items.implode()))
    else:
        small = before
    kept_users = pl.Series(sorted(set(small["user_id"].to_list())), dtype=pl.Utf8)
    items = ds.items.filter(pl.col("item_id").is_in(small["item_id"].unique().implode()))
    users = ds.users.filter(pl.col("user_id").is_in(kept_users.implode()))
    notes = dict(ds.notes)
    notes.update(sample_notes(ds, small, items, users, 0))
    notes["sample_dropped_interactions"] = before.height - small.height
    notes["sample_users_without_interactions"] = len(picked) - kept_users.len()
    log.info("trial sample (most-rated items) kept %s users, %s items, %s interactions; dropped %d of the kept "
             "users' %d interactions (items outside the sample); %d users left without interactions",
             notes["sample_kept_users"], notes["sample_kept_items"], notes["sample_kept_interactions"],
             notes["sample_dropped_interactions"], before.height, notes["sample_users_without_interactions"])
    return Dataset(name=ds.name, domain=ds.domain, interactions=small, items=items, users=users, notes=notes)


def _share(kept: int, total: int) -> str:
    return f"{kept} of {total} ({kept / total:.1%})" if total else f"{kept} of 0"


def sample_notes(full: Dataset, inter: pl.DataFrame, items: pl.DataFrame, users: pl.DataFrame,
                 passed_over: int) -> dict[str, str | int]:
    """How much of ``full`` a sample kept, for ``Dataset.notes`` (and so the job's closing summary)."""
    notes: dict[str, str | int] = {
        "sample_kept_users": _share(users.height, full.users.height),
        "sample_kept_items": _share(items.height, full.items.height),
        "sample_kept_interactions": _share(inter.height, full.interactions.height)}
    if passed_over:
        notes["sample_users_passed_over_for_limit_items"] = passed_over
    return notes
