"""Canonical in-memory tables every loader produces and every later stage reads.

All ids are strings (MovieLens ints and Amazon ASINs alike), so one schema serves every source.

interactions  user_id: Utf8, item_id: Utf8, rating: Float64, timestamp: Int64 (unix seconds)
items         item_id: Utf8, title: Utf8, genres: List(Utf8), category: Utf8?, sub_category: Utf8?,
              year: Int32?, plus any further attribute columns
users         user_id: Utf8, plus attribute columns (age: Int32?, gender: Utf8?, occupation: Utf8?, ...)
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

INTERACTIONS_SCHEMA = {"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64, "timestamp": pl.Int64}
ITEM_COLUMNS = {"item_id": pl.Utf8, "title": pl.Utf8, "genres": pl.List(pl.Utf8), "category": pl.Utf8,
                "sub_category": pl.Utf8, "year": pl.Int32}
USER_ID = {"user_id": pl.Utf8}


@dataclass
class Dataset:
    """One recommendation dataset in canonical form; ``domain`` picks prompt variants ("movie", "book")."""

    name: str
    domain: str
    interactions: pl.DataFrame
    items: pl.DataFrame
    users: pl.DataFrame


@dataclass
class Split:
    """The paper's old/new split.

    ``old_interactions`` feed old knowledge (the pools); ``new_interactions`` are the behaviour whose
    knowledge is generated now. Items are split into ``existing_items`` (have old knowledge) and
    ``new_items`` (knowledge to generate).
    """

    old_interactions: pl.DataFrame
    new_interactions: pl.DataFrame
    existing_items: pl.DataFrame
    new_items: pl.DataFrame
