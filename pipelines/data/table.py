"""Generic Parquet/CSV/TSV/JSON-lines loader with a column mapping (format "table").

``path`` is either the interactions file or a directory holding ``interactions_file`` (plus optional
``items_file`` and ``users_file``). ``columns`` maps canonical names to the file's names. Interactions
need user_id, item_id, rating and timestamp (unix seconds, a date/datetime column, or text read by
``dataset.timestamp_format``: epoch by default, iso, or a strftime format). Items need
item_id and use title, genres (a list, or text split on ``genres_separator``), category, sub_category
and year when present; other item and user columns are kept as attributes. Without an items file the
item id serves as the title.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data.config import DatasetConfig
from pipelines.data.readers import (MAX_BAD_FRACTION, DataFileError, coerce, drop_unknown_items, note,
                                    read_checked_csv)
from pipelines.data.schema import (INTERACTIONS_SCHEMA, Dataset, conform_interactions, conform_items,
                                   conform_users)

log = logging.getLogger(__name__)


LINE = "_line"  # CSV/TSV: file line (header = line 1); JSON lines: file line; Parquet: row number from 1


def read_table(path: Path, notes: dict[str, Any] | None = None) -> pl.DataFrame:
    """A whole table file by its extension: .parquet, .csv, .tsv, .jsonl/.ndjson (optionally .gz for text),
    with a ``_line`` column. CSV/TSV go through ``read_checked_csv`` (rows repaired or skipped are
    counted in ``notes``)."""
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    name = path.name.lower().removesuffix(".gz")
    try:
        if name.endswith(".parquet"):
            return pl.read_parquet(path).with_row_index(LINE, offset=1)
        if name.endswith((".csv", ".tsv")):
            frame = read_checked_csv(path, "\t" if name.endswith(".tsv") else ",", {} if notes is None else notes)
            return frame.rename({"line_no": LINE})
        if name.endswith((".jsonl", ".ndjson")):
            return pl.read_ndjson(path, infer_schema_length=None).with_row_index(LINE, offset=1)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{path}: unreadable ({err})") from err
    raise DataFileError(f"{path}: unknown table type; use .parquet, .csv, .tsv, .jsonl or .ndjson")


def _rename(frame: pl.DataFrame, mapping: dict[str, str], required: list[str], path: Path) -> pl.DataFrame:
    """Rename source columns to canonical names; error naming the file and column when a required one is missing."""
    missing = [f"{canon} (column {mapping[canon]!r})" for canon in required if mapping[canon] not in frame.columns]
    if missing:
        raise DataFileError(f"{path}: missing {', '.join(missing)}; found columns {frame.columns}")
    present = {src: canon for canon, src in mapping.items() if src in frame.columns and src != canon}
    return frame.drop([c for c in present.values() if c in frame.columns]).rename(present)


ISO_FORMATS = ("%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
               "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d")


def _parse_text_times(text: pl.Expr, fmt: str) -> pl.Expr:
    """Unix seconds of a text column by the declared format; digits are always unix seconds; null: no match.
    Every row is read by the same format(s): the result never depends on row order."""
    digits = pl.when(text.str.contains(r"^-?\d+$")).then(text.cast(pl.Int64, strict=False))
    if fmt == "epoch":
        return digits
    formats = ISO_FORMATS if fmt == "iso" else (fmt,)
    parsed = [text.str.strptime(pl.Datetime("us"), f, strict=False, exact=True).dt.epoch("s") for f in formats]
    return pl.coalesce(digits, *parsed)


def _timestamp_seconds(frame: pl.DataFrame, fmt: str, column: str, path: Path,
                       notes: dict[str, Any]) -> pl.DataFrame:
    """The timestamp column as unix seconds (Date/Datetime columns converted; text by ``fmt``, see
    ``dataset.timestamp_format``). Text that does not match is skipped and counted naming the column; a
    column that mostly does not match is an error."""
    dtype = frame.schema["timestamp"]
    if dtype == pl.Date:
        return frame.with_columns(pl.col("timestamp").cast(pl.Datetime("us")).dt.epoch("s"))
    if isinstance(dtype, pl.Datetime):
        return frame.with_columns(pl.col("timestamp").dt.epoch("s"))
    if dtype != pl.Utf8:
        return frame
    text = pl.col("timestamp").str.strip_chars()
    out = frame.with_columns(_raw=text, timestamp=_parse_text_times(text, fmt))
    bad = out.filter(pl.col("timestamp").is_null() & pl.col("_raw").is_not_null() & (pl.col("_raw") != ""))
    if bad.height:
        first = bad.row(0, named=True)
        if bad.height > MAX_BAD_FRACTION * frame.height:
            raise DataFileError(f"{path}: column {column!r}: {bad.height} of {frame.height} timestamps do not match "
                                f"dataset.timestamp_format {fmt!r} (first at row {first[LINE]}: {first['_raw']!r})")
        note(notes, path, f"timestamps in column {column!r} not matching dataset.timestamp_format {fmt!r}, skipped",
             bad[LINE].to_list())
        out = out.join(bad.select(LINE), on=LINE, how="anti")
    return out.drop("_raw")


def load_table(path: Path, cfg: DatasetConfig) -> Dataset:
    """Load the table files named by ``cfg`` (see the module docstring)."""
    mapping = cfg.columns.model_dump()
    directory = path if path.is_dir() else path.parent
    if path.is_dir():
        if not cfg.interactions_file:
            raise DataFileError(f"dataset.path {str(path)!r} is a directory: set dataset.interactions_file")
        inter_path = path / cfg.interactions_file
    else:
        inter_path = path
    required = list(INTERACTIONS_SCHEMA)
    notes: dict[str, Any] = {}
    inter = _rename(read_table(inter_path, notes), mapping, required, inter_path).select(*required, LINE)
    inter = _timestamp_seconds(inter, cfg.timestamp_format, mapping["timestamp"], inter_path, notes)
    inter = coerce(inter, INTERACTIONS_SCHEMA, required, inter_path, row_no=LINE, keep_row_no=True)

    if cfg.items_file:
        items_path = directory / cfg.items_file
        items = _rename(read_table(items_path, notes).drop(LINE), mapping, ["item_id"], items_path)
        if "genres" in items.columns and items.schema["genres"] == pl.Utf8:
            items = items.with_columns(pl.col("genres").str.split(cfg.genres_separator).list.eval(
                pl.element().str.strip_chars().filter(pl.element().str.strip_chars() != "")))
        if "title" not in items.columns:
            items = items.with_columns(title=pl.col("item_id"))
        items = items.with_columns(pl.col("item_id").cast(pl.Utf8),
                                   pl.col("title").cast(pl.Utf8).fill_null(pl.col("item_id").cast(pl.Utf8)))
        if "year" in items.columns:
            items = items.with_columns(pl.col("year").cast(pl.Int32, strict=False))
    else:
        log.warning("no dataset.items_file: item titles fall back to item ids")
        items = inter.select("item_id").unique().sort("item_id").with_columns(title=pl.col("item_id"))

    inter = inter.with_columns(pl.col("item_id").cast(pl.Utf8))
    if cfg.items_file:
        inter = drop_unknown_items(inter, items, inter_path, notes, LINE)
    inter = conform_interactions(inter.drop(LINE))
    if cfg.users_file:
        users_path = directory / cfg.users_file
        users = _rename(read_table(users_path, notes).drop(LINE), mapping, ["user_id"], users_path)
    else:
        users = inter.select("user_id").unique().sort("user_id")
    name = cfg.name or inter_path.name.split(".")[0]
    return Dataset(name=name, domain=cfg.resolved_domain(), interactions=inter, items=conform_items(items),
                   users=conform_users(users), notes=notes)
