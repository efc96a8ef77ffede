"""Amazon reviews + metadata loader (JSON lines, gzip or plain).

Both field namings are read: 2014/2018 (reviewerID, asin, overall, unixReviewTime; metadata
``categories`` as a list of category paths or ``category`` as one path) and 2023 (user_id, parent_asin,
rating, timestamp in milliseconds; metadata ``categories`` as one path). From a category path such as
["Books", "Literature & Fiction", "Mystery"]: ``category`` is the second level ("Literature & Fiction",
the first when the path has one level), ``sub_category`` the third, ``genres`` every level below the root.
Product attributes are kept as item columns the prompt templates read: ``brand`` (2023: ``store``), ``price``
(a number; text such as "$1,299.99" is parsed, a range or other text is null) and ``description`` (a list of
paragraphs joined, HTML tags removed).
When metadata is given, reviews of items without metadata are dropped (counted in the log).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data.readers import records_frame
from pipelines.data.schema import INTERACTIONS_SCHEMA, Dataset, DType, conform_interactions, conform_items

log = logging.getLogger(__name__)

_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz")
_MS_THRESHOLD = 100_000_000_000  # timestamps above this are milliseconds (year 5138 in seconds)
_YEAR = re.compile(r"\b(1[5-9]\d\d|20\d\d)\b")
_ITEM_SCHEMA: dict[str, DType] = {
    "item_id": pl.Utf8,
    "title": pl.Utf8,
    "genres": pl.List(pl.Utf8),
    "category": pl.Utf8,
    "sub_category": pl.Utf8,
    "year": pl.Int32,
    "brand": pl.Utf8,
    "price": pl.Float64,
    "description": pl.Utf8,
}
_PRICE = re.compile(r"^\$?\s*(\d[\d,]*(?:\.\d+)?)$")
_TAG = re.compile(r"<[^>]+>")


def _first(record: dict, *keys: str) -> Any:
    for key in keys:
        value = record.get(key)
        if value not in (None, ""):
            return value
    return None


def id_value(value: Any) -> str | None:
    """An id as text: ``10``, ``10.0`` and ``" 10 "`` are ``"10"``; empty, a list or a record is None."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    return str(value).strip() or None


def review_row(record: dict) -> dict | None:
    """Canonical interaction from one review record, or None when a field is missing or not a number."""
    user, item = id_value(_first(record, "user_id", "reviewerID")), id_value(_first(record, "parent_asin", "asin"))
    rating, ts = _first(record, "rating", "overall"), _first(record, "timestamp", "unixReviewTime")
    if user is None or item is None or rating is None or ts is None:
        return None
    try:
        rating, ts = float(rating), int(ts)
    except (TypeError, ValueError):
        return None
    if ts > _MS_THRESHOLD:
        ts //= 1000
    return {"user_id": user, "item_id": item, "rating": rating, "timestamp": ts}


def category_path(record: dict) -> list[str]:
    """The item's category path, whichever metadata naming it uses."""
    raw = _first(record, "categories", "category")
    if isinstance(raw, str):  # one level given as text
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        return []
    if isinstance(raw[0], list):  # 2014: a list of paths; the first is the main one
        raw = raw[0]
    return [str(c).strip() for c in raw if isinstance(c, str) and c.strip()]


def price_value(value: Any) -> float | None:
    """A price as a number: ``9.49``, ``"$1,299.99"``; a range (``"$5 - $9"``), other text or a bool is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    m = _PRICE.match(value.strip()) if isinstance(value, str) else None
    return float(m.group(1).replace(",", "")) if m else None


def text_value(value: Any) -> str | None:
    """Text from a string or a list of strings (paragraphs joined), HTML tags removed, spaces squeezed."""
    parts = value if isinstance(value, list) else [value]
    text = " ".join(_TAG.sub(" ", p) for p in parts if isinstance(p, str))
    return " ".join(text.split()) or None


def metadata_row(record: dict) -> dict | None:
    """Canonical item from one metadata record, or None without an id or a title."""
    item, title = id_value(_first(record, "parent_asin", "asin")), _first(record, "title")
    if item is None or not isinstance(title, str) or not title.strip():
        return None
    path = category_path(record)
    year_text = _first(record, "date", "published_date", "publication_date")
    year = _YEAR.search(str(year_text)) if year_text is not None else None
    return {
        "item_id": item,
        "title": title.strip(),
        "genres": path[1:] if len(path) > 1 else path,
        "category": path[1] if len(path) > 1 else (path[0] if path else None),
        "sub_category": path[2] if len(path) > 2 else None,
        "year": int(year.group(1)) if year else None,
        "brand": text_value(_first(record, "brand", "store")),
        "price": price_value(_first(record, "price")),
        "description": text_value(_first(record, "description")),
    }


def _find_files(directory: Path) -> tuple[Path, Path | None]:
    files = sorted(p for p in directory.iterdir() if p.name.lower().endswith(_JSON_SUFFIXES))
    meta = [p for p in files if p.name.lower().startswith("meta")]
    reviews = [p for p in files if p not in meta]
    if not reviews:
        raise FileNotFoundError(f"{directory} holds no Amazon reviews file (*.json[l][.gz] not starting with 'meta')")
    if len(reviews) > 1 or len(meta) > 1:
        raise ValueError(
            f"{directory} holds several candidate files (reviews {[p.name for p in reviews]}, metadata "
            f"{[p.name for p in meta]}); set dataset.reviews_file and dataset.metadata_file"
        )
    return reviews[0], (meta[0] if meta else None)


def load_amazon(path: Path, reviews_file: str | None = None, metadata_file: str | None = None) -> Dataset:
    """Load Amazon reviews (+ metadata): ``path`` is a directory, or the reviews file itself."""
    if path.is_dir():
        if reviews_file:
            reviews, meta = path / reviews_file, (path / metadata_file if metadata_file else None)
        else:
            reviews, meta = _find_files(path)
            meta = path / metadata_file if metadata_file else meta
    else:
        reviews, meta = path, (path.parent / metadata_file if metadata_file else None)
    log.info("reading Amazon reviews %s, metadata %s", reviews, meta)
    notes: dict[str, Any] = {}
    inter = conform_interactions(
        records_frame(reviews, review_row, INTERACTIONS_SCHEMA, notes, "a user, item, numeric rating or timestamp")
    )
    if meta is not None:
        items = records_frame(meta, metadata_row, _ITEM_SCHEMA, notes, "an item id or a title")
        known = inter["item_id"].is_in(items["item_id"].implode())
        if (~known).any():
            log.warning(
                "%s: dropped %d reviews of %d items without metadata",
                reviews,
                int((~known).sum()),
                inter.filter(~known)["item_id"].n_unique(),
            )
        inter = inter.filter(known)
    else:
        log.warning("no Amazon metadata file: item titles fall back to item ids")
        items = inter.select("item_id").unique().sort("item_id").with_columns(title=pl.col("item_id"))
    users = inter.select("user_id").unique().sort("user_id")
    name = reviews.name.split(".")[0]
    return Dataset(
        name=f"amazon-{name}", domain="book", interactions=inter, items=conform_items(items), users=users, notes=notes
    )
