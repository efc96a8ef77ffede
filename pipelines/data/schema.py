"""Canonical in-memory tables every loader produces and every later stage reads.

All ids are strings (MovieLens ints and Amazon ASINs alike), so one schema serves every source.

interactions  user_id: Utf8, item_id: Utf8, rating: Float64, timestamp: Int64 (unix seconds); implicit
              feedback (``dataset.feedback: implicit``) has rating null and adds weight: Float64 (how strong
              the interaction is: weight column x event weight, 1 without either) and event: Utf8? (view,
              purchase, ...); an explicit dataset has neither column, so its tables are as they always were
items         item_id: Utf8, title: Utf8, genres: List(Utf8), category: Utf8?, sub_category: Utf8?,
              year: Int32?, plus any further attribute columns
users         user_id: Utf8, plus attribute columns (age: Int32?, gender: Utf8?, occupation: Utf8?, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias, Union

import polars as pl

# a polars dtype, as a class (pl.Utf8) or an instance (pl.List(pl.Utf8)): polars takes both
DType: TypeAlias = Union[pl.DataType, type[pl.DataType]]

INTERACTIONS_SCHEMA: dict[str, DType] = {
    "user_id": pl.Utf8,
    "item_id": pl.Utf8,
    "rating": pl.Float64,
    "timestamp": pl.Int64,
}
IMPLICIT_COLUMNS: dict[str, DType] = {"weight": pl.Float64, "event": pl.Utf8}  # implicit feedback only
ITEM_COLUMNS: dict[str, DType] = {
    "item_id": pl.Utf8,
    "title": pl.Utf8,
    "genres": pl.List(pl.Utf8),
    "category": pl.Utf8,
    "sub_category": pl.Utf8,
    "year": pl.Int32,
}
USER_ID: dict[str, DType] = {"user_id": pl.Utf8}


@dataclass
class Dataset:
    """One recommendation dataset in canonical form; ``domain`` picks prompt variants ("movie", "book")."""

    name: str
    domain: str
    interactions: pl.DataFrame
    items: pl.DataFrame
    users: pl.DataFrame
    notes: dict[str, Any] = field(default_factory=dict)  # what loading and sampling skipped or repaired


@dataclass
class Split:
    """What knowledge is written from (pipelines/data/split.py).

    ``new_interactions`` are the behaviour whose knowledge is generated now; ``old_interactions`` the
    rest of each history. ``paper`` mode: old interactions feed old knowledge (the pools), a new
    prompt shows old and new history, and items are split into ``existing_items`` (have old knowledge)
    and ``new_items``. ``latest`` mode: a prompt shows the latest history only, every item is new.
    """

    old_interactions: pl.DataFrame
    new_interactions: pl.DataFrame
    existing_items: pl.DataFrame
    new_items: pl.DataFrame
    mode: str = "paper"

    @property
    def prompt_interactions(self) -> pl.DataFrame:
        """The interactions new knowledge's prompts show (paper: old and new; latest: the latest window)."""
        if self.mode == "latest":
            return self.new_interactions
        return pl.concat([self.old_interactions, self.new_interactions])

    @property
    def routing_interactions(self) -> pl.DataFrame:
        """What routing and LightGCN learn from (paper: old history only; latest: every interaction)."""
        if self.mode == "latest":
            return pl.concat([self.old_interactions, self.new_interactions])
        return self.old_interactions


def is_implicit(interactions: pl.DataFrame) -> bool:
    """Whether interactions are implicit feedback (they carry a ``weight`` column; module docstring)."""
    return "weight" in interactions.columns


def interaction_schema(frame: pl.DataFrame) -> dict[str, DType]:
    """The canonical columns of ``frame``: ``INTERACTIONS_SCHEMA``, plus ``IMPLICIT_COLUMNS`` when implicit."""
    return {**INTERACTIONS_SCHEMA, **(IMPLICIT_COLUMNS if is_implicit(frame) else {})}


def conform_interactions(frame: pl.DataFrame) -> pl.DataFrame:
    """Canonical interaction columns and types, exact duplicates dropped, sorted by user then time."""
    return (
        frame.select(pl.col(name).cast(dtype) for name, dtype in interaction_schema(frame).items())
        .unique(maintain_order=True)
        .sort(["user_id", "timestamp", "item_id"], maintain_order=True)
    )  # stable: ties keep file order


def conform_items(frame: pl.DataFrame) -> pl.DataFrame:
    """Canonical item columns first (missing ones null; extra attribute columns kept after them).

    ``category``/``sub_category`` default to the first/second genre where missing; the first row per
    item_id wins.
    """
    frame = frame.with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in ITEM_COLUMNS.items() if name not in frame.columns
    )
    frame = (
        frame.with_columns(pl.col(name).cast(dtype) for name, dtype in ITEM_COLUMNS.items())
        .with_columns(
            pl.col("genres").fill_null(pl.lit([], pl.List(pl.Utf8))),
        )
        .with_columns(
            pl.col("category").fill_null(pl.col("genres").list.get(0, null_on_oob=True)),
            pl.col("sub_category").fill_null(pl.col("genres").list.get(1, null_on_oob=True)),
        )
    )
    extras = [c for c in frame.columns if c not in ITEM_COLUMNS]
    return frame.select(*ITEM_COLUMNS, *extras).unique(subset="item_id", keep="first", maintain_order=True)


def conform_users(frame: pl.DataFrame) -> pl.DataFrame:
    """``user_id`` first as Utf8, attribute columns kept; the first row per user_id wins."""
    return (
        frame.with_columns(pl.col("user_id").cast(pl.Utf8))
        .select("user_id", pl.exclude("user_id"))
        .unique(subset="user_id", keep="first", maintain_order=True)
    )
