"""The paper's old/new split (LASER 2.2 and 4.1.1): streaming behaviour simulated on a static dataset.

Users: each user's history x_1..x_n is ordered by (timestamp, item_id). The cut is
``m = min((n + 1) // 2, max_hist)``; x_1..x_m is the old history (its knowledge builds the pools) and
the next ``new_count`` interactions x_{m+1}.. are the new history (knowledge generated now). A user with
a single interaction has no old history (m = 0): that one interaction is new. Interactions after the new
window are left out of both parts.

Items: within each category (missing category = one group of its own) items are shuffled with ``seed``
and ``round(new_item_fraction * size)`` of them become new items, the rest existing items.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from pipelines.data.schema import Dataset, Split


def split_old_new(ds: Dataset, seed: int = 0, max_hist: int = 30, new_item_fraction: float = 0.5,
                  new_count: int | None = None) -> Split:
    """Split users' histories into old/new and items into existing/new; deterministic per ``seed``.

    ``new_count`` is how many interactions after the cut form the new history (default ``max_hist``).
    """
    if max_hist < 1:
        raise ValueError(f"max_hist must be >= 1, got {max_hist}")
    if not 0.0 <= new_item_fraction <= 1.0:
        raise ValueError(f"new_item_fraction must be in [0, 1], got {new_item_fraction}")
    new_count = max_hist if new_count is None else new_count
    if new_count < 1:
        raise ValueError(f"new_count must be >= 1, got {new_count}")
    old, new = split_histories(ds.interactions, max_hist, new_count)
    existing_items, new_items = split_items(ds.items, seed, new_item_fraction)
    return Split(old_interactions=old, new_interactions=new, existing_items=existing_items, new_items=new_items)


def split_histories(interactions: pl.DataFrame, max_hist: int, new_count: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(old, new) interactions per the module rule; both sorted by user, then time."""
    ranked = interactions.sort(["user_id", "timestamp", "item_id"]).with_columns(
        _pos=pl.int_range(pl.len()).over("user_id"),
        _n=pl.len().over("user_id"),
    ).with_columns(
        _cut=pl.when(pl.col("_n") == 1).then(0).otherwise(pl.min_horizontal((pl.col("_n") + 1) // 2, max_hist)),
    )
    cols = interactions.columns
    old = ranked.filter(pl.col("_pos") < pl.col("_cut")).select(cols)
    new = ranked.filter((pl.col("_pos") >= pl.col("_cut")) & (pl.col("_pos") < pl.col("_cut") + new_count)).select(cols)
    return old, new


def split_items(items: pl.DataFrame, seed: int, new_item_fraction: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(existing, new) items, split per category with a seeded shuffle; both sorted by item_id."""
    rng = np.random.default_rng(seed)
    groups = items.select("item_id", pl.col("category").fill_null("")).sort(["category", "item_id"])
    new_ids: list[str] = []
    for (_,), group in groups.group_by(["category"], maintain_order=True):
        ids = group["item_id"].to_list()
        n_new = int(round(new_item_fraction * len(ids)))
        order = rng.permutation(len(ids))
        new_ids.extend(ids[k] for k in order[:n_new])
    is_new = pl.col("item_id").is_in(pl.Series(new_ids, dtype=pl.Utf8).implode())
    ordered = items.sort("item_id")
    return ordered.filter(~is_new), ordered.filter(is_new)
