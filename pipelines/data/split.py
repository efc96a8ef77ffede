"""How a dataset's behaviour is split into what knowledge is written from now, in one of two modes.

``latest`` (production, the default): a user's knowledge is written from their latest ``max_hist``
interactions (ordered by (timestamp, item_id)), so a new interaction always changes its inputs; every
item's knowledge is written from its attributes. ``old_interactions`` then holds the rest of each
history (routing and LightGCN see it, prompts do not), there are no "existing" items and no old
knowledge pass: earlier knowledge is whatever earlier runs wrote.

``paper`` (LASER 2.2 and 4.1.1, the benchmarks and the paper's studies): streaming behaviour simulated
on a static dataset. Each user's history x_1..x_n is cut at ``m = min((n + 1) // 2, max_hist)``;
x_1..x_m is the old history (its knowledge builds the pools) and the next ``new_count`` interactions
x_{m+1}.. are the new history. A user with a single interaction has no old history (m = 0). Items are
new with probability ``new_item_fraction``, decided per item by a seeded hash of its id, so adding an
item never re-draws the others.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import polars as pl

from pipelines.data.schema import Dataset, Split

SplitMode = Literal["latest", "paper"]


def split_old_new(
    ds: Dataset,
    seed: int = 0,
    max_hist: int = 30,
    new_item_fraction: float = 0.5,
    new_count: int | None = None,
    mode: SplitMode = "paper",
) -> Split:
    """Split users' histories and the items per ``mode`` (module docstring); deterministic per ``seed``.

    ``new_count`` (paper) is how many interactions after the cut form the new history (default ``max_hist``).
    """
    if max_hist < 1:
        raise ValueError(f"max_hist must be >= 1, got {max_hist}")
    if not 0.0 <= new_item_fraction <= 1.0:
        raise ValueError(f"new_item_fraction must be in [0, 1], got {new_item_fraction}")
    if mode == "latest":
        old, new = latest_histories(ds.interactions, max_hist)
        return Split(
            old_interactions=old,
            new_interactions=new,
            existing_items=ds.items.clear().sort("item_id"),
            new_items=ds.items.sort("item_id"),
            mode="latest",
        )
    new_count = max_hist if new_count is None else new_count
    if new_count < 1:
        raise ValueError(f"new_count must be >= 1, got {new_count}")
    old, new = split_histories(ds.interactions, max_hist, new_count)
    existing_items, new_items = split_items(ds.items, seed, new_item_fraction)
    return Split(old_interactions=old, new_interactions=new, existing_items=existing_items, new_items=new_items)


def _ranked(interactions: pl.DataFrame) -> pl.DataFrame:
    """Interactions ordered by user then time, with each one's position ``_pos`` and history length ``_n``."""
    return interactions.sort(["user_id", "timestamp", "item_id"]).with_columns(
        _pos=pl.int_range(pl.len()).over("user_id"), _n=pl.len().over("user_id")
    )


def latest_histories(interactions: pl.DataFrame, max_hist: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(earlier, latest): each user's latest ``max_hist`` interactions and the ones before them."""
    ranked = _ranked(interactions).with_columns(_cut=pl.max_horizontal(pl.col("_n").cast(pl.Int64) - max_hist, 0))
    cols = interactions.columns
    return (
        ranked.filter(pl.col("_pos") < pl.col("_cut")).select(cols),
        ranked.filter(pl.col("_pos") >= pl.col("_cut")).select(cols),
    )


def split_histories(interactions: pl.DataFrame, max_hist: int, new_count: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(old, new) interactions per the paper's rule; both sorted by user, then time."""
    ranked = _ranked(interactions).with_columns(
        _cut=pl.when(pl.col("_n") == 1).then(0).otherwise(pl.min_horizontal((pl.col("_n") + 1) // 2, max_hist)),
    )
    cols = interactions.columns
    old = ranked.filter(pl.col("_pos") < pl.col("_cut")).select(cols)
    new = ranked.filter((pl.col("_pos") >= pl.col("_cut")) & (pl.col("_pos") < pl.col("_cut") + new_count)).select(cols)
    return old, new


def is_new_item(item_id: str, seed: int, new_item_fraction: float) -> bool:
    """Whether an item is new in the paper split: a seeded hash of its id below the fraction (stable per item)."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < new_item_fraction * 2.0**64


def split_items(items: pl.DataFrame, seed: int, new_item_fraction: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(existing, new) items, each item decided by :func:`is_new_item`; both sorted by item_id."""
    ordered = items.sort("item_id")
    is_new = ordered["item_id"].map_elements(lambda i: is_new_item(i, seed, new_item_fraction), return_dtype=pl.Boolean)
    return ordered.filter(~is_new), ordered.filter(is_new)
