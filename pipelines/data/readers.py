"""Tolerant file readers shared by the loaders: text decoding, delimited lines, JSON lines, row checks.

A few malformed rows are skipped with a logged count and the first offending line numbers; a missing
file, or a file where most rows are unreadable, raises an error that names the file.
"""
from __future__ import annotations

import ast
import gzip
import io
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

log = logging.getLogger(__name__)

MAX_BAD_FRACTION = 0.5  # more unreadable rows than this and the file is rejected
SHOWN_BAD_LINES = 5


class DataFileError(ValueError):
    """A data file is missing required content or mostly unreadable."""


def _require(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")


def read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the name ends in .gz."""
    _require(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataFileError(f"{path}: not a readable gzip file ({err})") from err
    return raw


def utf8_bytes(raw: bytes, path: Path) -> bytes:
    """``raw`` as UTF-8: unchanged when valid UTF-8, else decoded as Latin-1 (old MovieLens files)."""
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        log.info("%s is not UTF-8; reading it as Latin-1", path)
        return raw.decode("latin-1").encode("utf-8")


def read_lines(path: Path) -> pl.DataFrame:
    """Columns ``line_no`` (1-based) and ``line`` (null for blank lines) of a text file."""
    data = utf8_bytes(read_bytes(path), path)
    if not data.strip():
        return pl.DataFrame(schema={"line_no": pl.UInt32, "line": pl.Utf8})
    frame = pl.read_csv(io.BytesIO(data), has_header=False, separator="\x1f", quote_char=None,
                        schema={"line": pl.Utf8}, truncate_ragged_lines=True)
    return frame.with_row_index("line_no", offset=1)


def report_bad(path: Path, total: int, bad_line_numbers: Sequence[int], what: str = "line") -> None:
    """Log skipped rows; raise ``DataFileError`` when the file is empty or mostly unreadable."""
    if total == 0:
        raise DataFileError(f"{path}: no data rows")
    n_bad = len(bad_line_numbers)
    if n_bad == 0:
        return
    first = ", ".join(str(n) for n in list(bad_line_numbers)[:SHOWN_BAD_LINES])
    if n_bad > MAX_BAD_FRACTION * total:
        raise DataFileError(f"{path}: {n_bad} of {total} {what}s are malformed (first at {what} {first}); "
                            "is this the right file and format?")
    log.warning("%s: skipped %d malformed %s(s) of %d (first at %s %s)", path, n_bad, what, total, what, first)


def cast_rows(frame: pl.DataFrame, dtypes: dict[str, pl.DataType], required: Sequence[str],
              row_no: str = "line_no", keep_row_no: bool = False) -> tuple[pl.DataFrame, list[int]]:
    """Cast columns (non-strict; text stripped, empty text = missing); split off rows whose ``required``
    columns end up null. Returns (good rows without ``row_no``, row numbers of the bad rows)."""
    def typed(name: str, dtype: pl.DataType) -> pl.Expr:
        col = pl.col(name)
        if frame.schema[name] == pl.Utf8:
            col = col.str.strip_chars()
            col = pl.when(col != "").then(col)  # empty text is missing
        return col.cast(dtype, strict=False)

    cast = frame.with_columns(typed(name, dtype) for name, dtype in dtypes.items())
    ok = pl.all_horizontal(pl.col(c).is_not_null() for c in required)
    good = cast.filter(ok)
    return (good if keep_row_no else good.drop(row_no)), cast.filter(~ok)[row_no].to_list()


def coerce(frame: pl.DataFrame, dtypes: dict[str, pl.DataType], required: Sequence[str], path: Path,
           row_no: str = "line_no", keep_row_no: bool = False) -> pl.DataFrame:
    """``cast_rows`` plus ``report_bad``: the typed good rows of a frame read from ``path``."""
    good, bad = cast_rows(frame, dtypes, required, row_no, keep_row_no)
    report_bad(path, frame.height, bad, "line" if row_no == "line_no" else "row")
    return good


def read_delimited(path: Path, separator: str, names: Sequence[str], dtypes: dict[str, pl.DataType],
                   required: Sequence[str], keep_line_no: bool = False) -> pl.DataFrame:
    """A headerless file with a (possibly multi-character) separator, e.g. MovieLens ``::`` or ``|``.

    Columns not in ``dtypes`` stay strings. Lines with the wrong number of fields or uncastable
    required fields are skipped and reported; blank lines are ignored.
    """
    lines = read_lines(path).filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    parts = lines.with_columns(pl.col("line").str.strip_chars_end("\r").str.split(separator).alias("_f"))
    good_shape = pl.col("_f").list.len() == len(names)
    fields = parts.filter(good_shape).select(
        "line_no", *(pl.col("_f").list.get(k).alias(n) for k, n in enumerate(names)))
    good, bad_cast = cast_rows(fields, {n: dtypes[n] for n in names if n in dtypes}, required,
                               keep_row_no=keep_line_no)
    report_bad(path, lines.height, sorted(parts.filter(~good_shape)["line_no"].to_list() + bad_cast))
    return good


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict | None]]:
    """(line number, record) for each non-blank line; the record is None when the line does not parse
    as a JSON object or a Python dict literal (old Amazon metadata files are the latter)."""
    text = utf8_bytes(read_bytes(path), path).decode("utf-8")
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            try:
                record = ast.literal_eval(line.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                record = None
        yield no, record if isinstance(record, dict) else None


def records_frame(path: Path, extract: Callable[[dict], dict | None], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Map each JSON-lines record through ``extract`` into a typed frame.

    Lines that do not parse and records ``extract`` rejects (returns None) are skipped and reported.
    """
    rows: list[dict] = []
    bad: list[int] = []
    total = 0
    for no, record in iter_json_lines(path):
        total += 1
        row = extract(record) if record is not None else None
        if row is None:
            bad.append(no)
        else:
            rows.append(row)
    report_bad(path, total, bad)
    return pl.DataFrame(rows, schema=schema, orient="row")


# ---- checked CSV: the load report ----------------------------------------------------------------
# Line numbers are physical lines of the file, counting from 1, so the header is line 1 and the first
# data row is line 2.

_QUOTED = r'"[^"]*"'  # a quoted field (doubled quotes inside split into adjacent matches, all removed)


def note(notes: dict[str, Any], path: Path, what: str, lines: Sequence[int]) -> None:
    """Record ``len(lines)`` rows of ``path`` skipped or repaired for ``what`` in a load report, and log it."""
    if not lines:
        return
    shown = sorted(lines)[:SHOWN_BAD_LINES * 2]
    notes[f"{path.name}: {what}"] = {"count": len(lines), "lines": shown}
    log.warning("%s: %s: %d line(s) (file lines, header = line 1): %s%s", path, what, len(lines), shown,
                " ..." if len(lines) > len(shown) else "")


def utf8_lines(raw: bytes) -> tuple[bytes, list[int]]:
    """``raw`` as UTF-8; each line that is not valid UTF-8 is decoded as Latin-1 instead (repaired).
    Returns the text and the 1-based numbers of the repaired lines."""
    try:
        raw.decode("utf-8")
        return raw, []
    except UnicodeDecodeError:
        pass
    out, repaired = [], []
    for no, line in enumerate(raw.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            line = line.decode("latin-1").encode("utf-8")
            repaired.append(no)
        out.append(line)
    return b"\n".join(out), repaired


def read_checked_csv(path: Path, separator: str, notes: dict[str, Any]) -> pl.DataFrame:
    """A headed CSV/TSV as strings plus ``line_no`` (file line, header = 1), by documented rules:
    lines that are not UTF-8 are repaired as Latin-1; lines with more or fewer fields than the header
    are skipped. Both are counted in ``notes`` with their line numbers. Quoted fields may hold the
    separator but not a line break (such a row is reported as malformed)."""
    raw, repaired = utf8_lines(read_bytes(path))
    lines = pl.read_csv(io.BytesIO(raw), has_header=False, separator="\x1f", quote_char=None,
                        schema={"line": pl.Utf8}, truncate_ragged_lines=True).with_row_index("line_no", offset=1)
    lines = lines.with_columns(pl.col("line").str.strip_chars_end("\r")).filter(
        pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    if lines.is_empty():
        raise DataFileError(f"{path}: empty file")
    fields = pl.col("line").str.replace_all(_QUOTED, "").str.count_matches(separator, literal=True) + 1
    lines = lines.with_columns(_n=fields)
    width = lines["_n"][0]
    body = lines.slice(1)
    note(notes, path, "lines not UTF-8, repaired as Latin-1", repaired)
    note(notes, path, f"rows with more fields than the header's {width}, skipped",
         body.filter(pl.col("_n") > width)["line_no"].to_list())
    note(notes, path, f"rows with fewer fields than the header's {width}, skipped",
         body.filter(pl.col("_n") < width)["line_no"].to_list())
    good = body.filter(pl.col("_n") == width)
    text = "\n".join([lines["line"][0], *good["line"].to_list()])
    try:
        frame = pl.read_csv(io.BytesIO(text.encode()), separator=separator, infer_schema=False)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{path}: unreadable CSV ({err})") from err
    if frame.height != good.height:
        raise DataFileError(f"{path}: {good.height} rows checked but {frame.height} parsed; a quoted field "
                            "probably holds a line break")
    return frame.with_columns(good["line_no"])


def drop_unknown_items(inter: pl.DataFrame, items: pl.DataFrame, path: Path, notes: dict[str, Any],
                       line_col: str = "line_no") -> pl.DataFrame:
    """Interactions whose item is in ``items`` (the catalogue); the others are skipped and counted."""
    known = pl.col("item_id").is_in(items["item_id"].implode())
    note(notes, path, "interactions with items missing from the items file, skipped",
         inter.filter(~known)[line_col].to_list())
    return inter.filter(known)
