"""Item identifiers (what the model writes to name an item) and the recommendation prompt."""

from __future__ import annotations

from typing import Sequence

import polars as pl

from pipelines.workers import HistoryEntry
from pipelines.knowledge.prompts import action, check_domain, as_text, display_title, format_rating
from pipelines.knowledge.validation import JobInputError

RECOMMEND_PROMPT_VERSION = "rec-v1"
_ASK = {
    "movie": "Which movie will this user watch next? Answer with its title only.",
    "book": "Which book will this user read next? Answer with its title only.",
}
_INTRO = {
    "movie": "A user rated these movies, oldest first (1 star = disliked, 5 stars = loved):",
    "book": "A user rated these books, oldest first (1 star = disliked, 5 stars = loved):",
}


def item_identifiers(items: pl.DataFrame, code_column: str | None = None) -> dict[str, str]:
    """item_id -> identifier: ``code_column``'s value, or the title with its year (``Title (1995)``).

    Every item needs a non-empty identifier and no two items may share one (the model could not tell
    them apart); the error names the items, the column and how to tell them apart.
    """
    column = code_column or "title"
    if column not in items.columns:
        raise JobInputError(
            f"recommend.item_code_column: the items table has no column {column!r} (columns: {items.columns})"
        )
    has_year = code_column is None and "year" in items.columns
    columns = dict.fromkeys(["item_id", column, *(["year"] if has_year else [])])  # item_id may be the code
    rows = items.select(*columns).iter_rows(named=True)
    out: dict[str, str] = {}
    for row in rows:
        value = row[column]
        if value is None or not str(value).strip():
            raise JobInputError(
                f"items table, item {row['item_id']!r}: empty {column!r}; every item needs an "
                "identifier (fill it, or set recommend.item_code_column to a complete column)"
            )
        ident = display_title(str(value).strip(), row.get("year")) if has_year else str(value).strip()
        out[row["item_id"]] = as_text(ident)  # the model writes it: text, never a control token
    by_ident: dict[str, list[str]] = {}
    for item, ident in out.items():
        by_ident.setdefault(ident, []).append(item)
    dups = {k: v for k, v in by_ident.items() if len(v) > 1}
    if dups:
        ident, ids = next(iter(sorted(dups.items())))
        told = "titles are told apart by their year" if has_year else f"{column!r} must be unique"
        raise JobInputError(
            f"items table: {len(dups)} identifiers name several items, e.g. {ident!r} for items "
            f"{ids}; {told}, so set recommend.item_code_column to a column with one distinct "
            "value per item (an item code)"
        )
    return out


def recommend_prompt(
    history: Sequence[HistoryEntry | tuple], domain: str = "movie", user_id: str | None = None, max_history: int = 20
) -> str:
    """The chat message asking for the next item after the newest ``max_history`` entries."""
    check_domain(domain)
    entries = [HistoryEntry(*e) for e in history][-max_history:]
    if not entries:
        raise ValueError(f"user {user_id!r} has no history to recommend from")
    lines = [  # implicit feedback (no rating): what the user did
        f'"{as_text(e.title)}", {format_rating(e.rating) if e.rating is not None else action(e.event)};'
        for e in entries
    ]
    return "\n".join([_INTRO[domain], *lines, "", _ASK[domain]])
