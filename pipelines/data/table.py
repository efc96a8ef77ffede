"""Generic Parquet/CSV/TSV/JSON-lines loader with a column mapping (format "table").

``path`` is either the interactions table or a directory holding ``interactions_file`` (plus optional
``items_file`` and ``users_file``). Each table is a file, a folder of Parquet files, a glob or Hive
partitions, locally or behind a URI (pipelines/data/table_files.py); Parquet interactions read only the mapped
columns, items and users every column. ``columns`` maps canonical names to the file's names. Interactions
need user_id, item_id, rating and timestamp (unix seconds, a date/datetime column, or text read by
``dataset.timestamp_format``: epoch by default, iso, or a strftime format). Items need item_id and
title, and use genres (a list, or text split on ``genres_separator``), category (text, or a list read
as a category path), sub_category and year when present; other item and user columns are kept as
attributes. Without an items file the item id serves as the title.

Ids are text whatever a file types them as (``10``, ``10.0`` from an integer column with gaps and
``"10"`` are the same id). Bad rows are skipped one at a time and counted in ``Dataset.notes`` with
their file line: an empty id, a line that is not JSON, a CSV line with an unbalanced quote or the
wrong number of fields, an invalid rating or timestamp.

Implicit feedback (``dataset.feedback: implicit``): no rating is read; the optional ``columns.weight``
(a count, dwell seconds) and ``columns.event`` (view, click, purchase, ...) are, and each interaction's
weight is the weight column's value (1 without one) times its event's ``dataset.event_weights`` entry (1
without event weights). An empty weight or event, or an event that ``event_weights`` does not list, skips
the row, counted naming the column (and the value); more than half the rows so skipped stops the load.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.store.location import Location
from pipelines.data.config import DatasetConfig
from pipelines.data.readers import (
    MAX_BAD_FRACTION,
    DataFileError,
    Where,
    coerce,
    drop_empty_ids,
    drop_unknown_items,
    id_text,
    note,
    read_checked_csv,
    read_json_table,
)
from pipelines.data.table_files import TableSource, columns_of, locate, read_parquet, resolve
from pipelines.data.schema import (
    IMPLICIT_COLUMNS,
    INTERACTIONS_SCHEMA,
    Dataset,
    conform_interactions,
    conform_items,
    conform_users,
)

log = logging.getLogger(__name__)


LINE = "_line"  # CSV/TSV: file line (header = line 1); JSON lines: file line; Parquet: row number from 1


def read_table(path: Where, notes: dict[str, Any] | None = None) -> pl.DataFrame:
    """A whole table file by its extension: .parquet, .csv, .tsv, .jsonl/.ndjson (optionally .gz for text),
    with a ``_line`` column. CSV/TSV go through ``read_checked_csv``, JSON lines through ``read_json_table``
    (rows repaired or skipped are counted in ``notes``). ``path``: a local file or a Location (a URI)."""
    if not path.is_file() if isinstance(path, Path) else not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    name = path.name.lower().removesuffix(".gz")
    try:
        if name.endswith(".parquet"):
            data = path.read_bytes() if isinstance(path, Location) else path
            return pl.read_parquet(data).with_row_index(LINE, offset=1)
        if name.endswith((".csv", ".tsv")):
            frame = read_checked_csv(path, "\t" if name.endswith(".tsv") else ",", {} if notes is None else notes)
            return frame.rename({"line_no": LINE})
        if name.endswith((".jsonl", ".ndjson")):
            return read_json_table(path, LINE, {} if notes is None else notes)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{path}: unreadable ({err})") from err
    raise DataFileError(f"{path}: unknown table type; use .parquet, .csv, .tsv, .jsonl or .ndjson")


def read_source(
    src: TableSource,
    mapping: dict[str, str],
    required: list[str],
    notes: dict[str, Any],
    keep_all: bool,
    hint: str = "",
) -> pl.DataFrame:
    """The table ``src`` names with a ``_line`` column, ``required`` (canonical names) checked first: a
    missing one names the table, lists its columns, and adds ``hint``. Parquet reads only the mapped
    columns unless ``keep_all`` (items and users keep every column: attributes the prompts may show)."""
    if not src.parquet:
        frame = read_table(src.local_file(), notes)
        _check_columns(src.label, [c for c in frame.columns if c != LINE], mapping, required, hint)
        return frame
    available = columns_of(src)
    _check_columns(src.label, available, mapping, required, hint)
    wanted = None if keep_all else [c for c in dict.fromkeys(mapping[k] for k in required) if c in available]
    return read_parquet(src, wanted, LINE)


def _check_columns(label: Where, available: list[str], mapping: dict[str, str], required: list[str], hint: str) -> None:
    """Error naming the table and the column when a required one is missing; lists the columns there."""
    missing = [f"{canon} (column {mapping[canon]!r})" for canon in required if mapping[canon] not in available]
    if missing:
        raise DataFileError(f"{label}: missing {', '.join(missing)}; found columns {available}{hint}")


def _rename(frame: pl.DataFrame, mapping: dict[str, str]) -> pl.DataFrame:
    """Rename source columns to canonical names (a column already named canonically that is not the mapped
    one is dropped)."""
    present = {src: canon for canon, src in mapping.items() if src in frame.columns and src != canon}
    return frame.drop([c for c in present.values() if c in frame.columns]).rename(present)


ISO_FORMATS = (
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%d",
)


def _parse_text_times(text: pl.Expr, fmt: str) -> pl.Expr:
    """Unix seconds of a text column by the declared format; digits are always unix seconds; null: no match.
    Every row is read by the same format(s): the result never depends on row order."""
    digits = pl.when(text.str.contains(r"^-?\d+$")).then(text.cast(pl.Int64, strict=False))
    if fmt == "epoch":
        return digits
    formats = ISO_FORMATS if fmt == "iso" else (fmt,)
    parsed = [text.str.strptime(pl.Datetime("us"), f, strict=False, exact=True).dt.epoch("s") for f in formats]
    return pl.coalesce(digits, *parsed)


def _timestamp_seconds(frame: pl.DataFrame, fmt: str, column: str, path: Where, notes: dict[str, Any]) -> pl.DataFrame:
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
            raise DataFileError(
                f"{path}: column {column!r}: {bad.height} of {frame.height} timestamps do not match "
                f"dataset.timestamp_format {fmt!r} (first at row {first[LINE]}: {first['_raw']!r})"
            )
        note(
            notes,
            path,
            f"timestamps in column {column!r} not matching dataset.timestamp_format {fmt!r}, skipped",
            bad[LINE].to_list(),
        )
        out = out.join(bad.select(LINE), on=LINE, how="anti")
    return out.drop("_raw")


def load_table(path: str | Path, cfg: DatasetConfig) -> Dataset:
    """Load the tables named by ``cfg`` (see the module docstring)."""
    mapping = cfg.columns.model_dump()
    inter_src, beside = _interactions_source(str(path), cfg)
    label = inter_src.label
    required = interaction_columns(cfg)
    notes: dict[str, Any] = {}
    hint = "" if cfg.interactions_file or not inter_src.whole else "; if this folder holds the tables, set "
    hint += "dataset.interactions_file" if hint else ""
    inter = _rename(read_source(inter_src, mapping, required, notes, keep_all=False, hint=hint), mapping)
    inter = inter.select(*required, LINE)
    for key in ("user_id", "item_id"):
        inter = id_text(inter, key, label, mapping[key])
    inter = _timestamp_seconds(inter, cfg.timestamp_format, mapping["timestamp"], label, notes)
    if "event" in inter.columns:  # blank events are missing ones
        event = pl.col("event").cast(pl.Utf8).str.strip_chars()
        inter = inter.with_columns(event=pl.when(event != "").then(event))
    inter = coerce(
        inter,
        {k: t for k, t in {**INTERACTIONS_SCHEMA, **IMPLICIT_COLUMNS}.items() if k in required},
        required,
        label,
        row_no=LINE,
        keep_row_no=True,
        notes=notes,
        names={k: mapping[k] for k in required},
    )
    if cfg.feedback == "implicit":
        inter = implicit_weights(inter, cfg.event_weights, label, mapping["event"], notes)

    if cfg.items_file:
        items = _read_items(locate(resolve(beside, cfg.items_file), "dataset.items_file"), cfg, mapping, notes)
    else:
        log.warning("no dataset.items_file: item titles fall back to item ids")
        items = inter.select("item_id").unique().sort("item_id").with_columns(title=pl.col("item_id"))

    inter = inter.with_columns(pl.col("item_id").cast(pl.Utf8))
    if cfg.items_file:
        inter = drop_unknown_items(inter, items, label, notes, LINE)
    inter = conform_interactions(inter.drop(LINE))
    if cfg.users_file:
        users_src = locate(resolve(beside, cfg.users_file), "dataset.users_file")
        users = _rename(read_source(users_src, mapping, ["user_id"], notes, keep_all=True), mapping)
        users = drop_empty_ids(users, "user_id", users_src.label, notes, LINE, mapping["user_id"]).drop(LINE)
    else:
        users = inter.select("user_id").unique().sort("user_id")
    name = cfg.name or inter_src.name.split(".")[0]
    return Dataset(
        name=name,
        domain=cfg.resolved_domain(),
        interactions=inter,
        items=conform_items(items),
        users=conform_users(users),
        notes=notes,
    )


def interaction_columns(cfg: DatasetConfig) -> list[str]:
    """The canonical interaction columns read from the file: rating for explicit feedback, the mapped weight
    and event columns for implicit feedback."""
    if cfg.feedback == "explicit":
        return list(INTERACTIONS_SCHEMA)
    return ["user_id", "item_id", "timestamp", *(k for k in IMPLICIT_COLUMNS if getattr(cfg.columns, k))]


def implicit_weights(
    inter: pl.DataFrame, event_weights: dict[str, float] | None, path: Where, column: str | None, notes: dict[str, Any]
) -> pl.DataFrame:
    """Implicit interactions: rating null, ``weight`` = the weight column (1 without one) x the event's weight
    (module docstring), ``event`` kept (null without an event column). An event ``event_weights`` lacks skips
    its row, counted naming the column and the values; a column mostly of such events is an error."""
    weight = pl.col("weight") if "weight" in inter.columns else pl.lit(1.0)
    if "event" not in inter.columns:
        inter = inter.with_columns(event=pl.lit(None, pl.Utf8))
    elif event_weights is not None:
        unknown = inter.filter(~pl.col("event").is_in(list(event_weights)))
        if unknown.height:
            values = unknown["event"].unique(maintain_order=True).head(5).to_list()
            what = f"events in column {column!r} not in dataset.event_weights ({', '.join(map(repr, values))})"
            if unknown.height > MAX_BAD_FRACTION * inter.height:
                raise DataFileError(
                    f"{path}: {unknown.height} of {inter.height} {what}; dataset.event_weights lists "
                    f"{sorted(event_weights)}"
                )
            note(notes, path, what + ", skipped", unknown[LINE].to_list())
            inter = inter.join(unknown.select(LINE), on=LINE, how="anti")
        weight = weight * pl.col("event").replace_strict(event_weights, return_dtype=pl.Float64)
    return inter.with_columns(rating=pl.lit(None, pl.Float64), weight=weight.cast(pl.Float64))


def _interactions_source(path: str, cfg: DatasetConfig) -> tuple[TableSource, Location]:
    """The interactions table and the folder items_file/users_file resolve against: ``path`` itself when it
    holds ``interactions_file``; else a file's folder, or the folder above a Parquet folder or glob."""
    if cfg.interactions_file:
        base = Location.of(path)
        return locate(resolve(base, cfg.interactions_file), "dataset.interactions_file"), base
    src = locate(path, "dataset.path")
    return src, src.above


SCALAR_ITEM_COLUMNS = ("title", "sub_category", "year")  # a list here has no one reading: the load stops


def _read_items(src: TableSource, cfg: DatasetConfig, mapping: dict[str, str], notes: dict[str, Any]) -> pl.DataFrame:
    """The items table, every column kept: rows without an id skipped and counted; ``title`` required (an item
    prompt needs one; an empty title falls back to the id, counted); a list in ``category`` read as a
    category path."""
    path = src.label
    items = _rename(read_source(src, mapping, ["item_id", "title"], notes, keep_all=True), mapping)
    items = drop_empty_ids(items, "item_id", path, notes, LINE, mapping["item_id"])
    for column in (c for c in SCALAR_ITEM_COLUMNS if c in items.columns):
        if items.schema[column].is_nested():
            raise DataFileError(
                f"{path}: column {mapping[column]!r} holds {items.schema[column]} values, not one "
                f"{column} per item; map columns.{column} to a column of single values"
            )
    items = _category_path(items, path, notes, mapping["category"])
    if "genres" in items.columns and items.schema["genres"] == pl.Utf8:
        items = items.with_columns(
            pl.col("genres")
            .str.split(cfg.genres_separator)
            .list.eval(pl.element().str.strip_chars().filter(pl.element().str.strip_chars() != ""))
        )
    title = pl.col("title").cast(pl.Utf8).str.strip_chars()
    items = items.with_columns(title=pl.when(title != "").then(title))
    note(
        notes,
        path,
        f"items with an empty title (column {mapping['title']!r}): the item id is the title",
        items.filter(pl.col("title").is_null())[LINE].to_list(),
    )
    items = items.with_columns(pl.col("title").fill_null(pl.col("item_id")))
    if "year" in items.columns:
        items = items.with_columns(pl.col("year").cast(pl.Int32, strict=False))
    return items.drop(LINE)


def _category_path(items: pl.DataFrame, path: Where, notes: dict[str, Any], source: str) -> pl.DataFrame:
    """A list in ``category`` is a category path: its first entry the category, its second the sub-category
    where none is given (rows repaired are counted in ``notes``). Records there stop the load."""
    dtype = items.schema.get("category")
    if dtype is None or not dtype.is_nested():
        return items
    if not isinstance(dtype, pl.List):
        raise DataFileError(
            f"{path}: column {source!r} (category) holds {dtype} values; expected text or a list of text"
        )
    listed = items.filter(pl.col("category").list.len() > 0)[LINE].to_list()
    path_ = pl.col("category").cast(pl.List(pl.Utf8))
    second = path_.list.get(1, null_on_oob=True)
    sub = pl.coalesce(pl.col("sub_category").cast(pl.Utf8), second) if "sub_category" in items.columns else second
    note(
        notes,
        path,
        f"items whose category (column {source!r}) is a list: the first entry is the category, the "
        "second the sub-category",
        listed,
    )
    return items.with_columns(category=path_.list.get(0, null_on_oob=True), sub_category=sub)
