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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, Union

import polars as pl

from pipelines.data.schema import DType
from pipelines.store.location import Location

log = logging.getLogger(__name__)

MAX_BAD_FRACTION = 0.5  # more unreadable rows than this and the file is rejected
SHOWN_BAD_LINES = 5


Where: TypeAlias = Union[Path, Location]  # a local file, or a file behind a URI (named by it in messages)


class DataFileError(ValueError):
    """A data file is missing required content or mostly unreadable."""


def _require(path: Where) -> None:
    if not (path.is_file() if isinstance(path, Path) else path.fs.isfile(path.path)):
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")


def read_bytes(path: Where) -> bytes:
    """File contents, gunzipped when the name ends in .gz."""
    _require(path)
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataFileError(f"{path}: not a readable gzip file ({err})") from err
    return raw


def utf8_bytes(raw: bytes, path: Where) -> bytes:
    """``raw`` as UTF-8: unchanged when valid UTF-8, else decoded as Latin-1 (old MovieLens files)."""
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        log.info("%s is not UTF-8; reading it as Latin-1", path)
        return raw.decode("latin-1").encode("utf-8")


def read_lines(path: Where) -> pl.DataFrame:
    """Columns ``line_no`` (1-based) and ``line`` (null for blank lines) of a text file."""
    data = utf8_bytes(read_bytes(path), path)
    if not data.strip():
        return pl.DataFrame(schema={"line_no": pl.UInt32, "line": pl.Utf8})
    frame = pl.read_csv(
        io.BytesIO(data),
        has_header=False,
        separator="\x1f",
        quote_char=None,
        schema={"line": pl.Utf8},
        truncate_ragged_lines=True,
    )
    return frame.with_row_index("line_no", offset=1)


def report_bad(
    path: Where,
    total: int,
    bad_line_numbers: Sequence[int],
    what: str = "line",
    notes: dict[str, Any] | None = None,
    why: str = "",
    columns: Sequence[str] = (),
) -> None:
    """Log skipped rows and record them in ``notes`` (when given) as ``malformed {what}s{why}``; raise
    ``DataFileError`` when the file is empty or mostly unreadable (naming ``columns``, the fields at fault)."""
    if total == 0:
        raise DataFileError(f"{path}: no data rows")
    n_bad = len(bad_line_numbers)
    if n_bad == 0:
        return
    first = ", ".join(str(n) for n in list(bad_line_numbers)[:SHOWN_BAD_LINES])
    if n_bad > MAX_BAD_FRACTION * total:
        where = f" (column {', '.join(repr(c) for c in columns)} empty or invalid)" if columns else ""
        raise DataFileError(
            f"{path}: {n_bad} of {total} {what}s are malformed{where} (first at {what} {first}); "
            "is this the right file and format?"
        )
    log.warning("%s: skipped %d malformed %s(s) of %d (first at %s %s)", path, n_bad, what, total, what, first)
    if notes is not None:
        _record(notes, path, f"malformed {what}s{why}, skipped", bad_line_numbers)


def _cast(frame: pl.DataFrame, dtypes: Mapping[str, DType]) -> pl.DataFrame:
    """Columns cast non-strictly (a value that does not cast is null); text stripped, empty text null."""

    def typed(name: str, dtype: DType) -> pl.Expr:
        col = pl.col(name)
        if frame.schema[name] == pl.Utf8:
            col = col.str.strip_chars()
            col = pl.when(col != "").then(col)  # empty text is missing
        return col.cast(dtype, strict=False)

    return frame.with_columns(typed(name, dtype) for name, dtype in dtypes.items())


def cast_rows(
    frame: pl.DataFrame,
    dtypes: Mapping[str, DType],
    required: Sequence[str],
    row_no: str = "line_no",
    keep_row_no: bool = False,
) -> tuple[pl.DataFrame, list[int]]:
    """Cast columns (non-strict; text stripped, empty text = missing); split off rows whose ``required``
    columns end up null. Returns (good rows without ``row_no``, row numbers of the bad rows)."""
    cast = _cast(frame, dtypes)
    ok = pl.all_horizontal(pl.col(c).is_not_null() for c in required)
    good = cast.filter(ok)
    return (good if keep_row_no else good.drop(row_no)), cast.filter(~ok)[row_no].to_list()


def coerce(
    frame: pl.DataFrame,
    dtypes: Mapping[str, DType],
    required: Sequence[str],
    path: Where,
    row_no: str = "line_no",
    keep_row_no: bool = False,
    notes: dict[str, Any] | None = None,
    names: dict[str, str] | None = None,
) -> pl.DataFrame:
    """``cast_rows`` plus ``report_bad``: the typed good rows of a frame read from ``path``; the skipped
    rows are counted in ``notes`` naming the required columns (``names``: canonical -> the file's name)."""
    cast = _cast(frame, dtypes)
    ok = pl.all_horizontal(pl.col(c).is_not_null() for c in required)
    good, bad = cast.filter(ok), cast.filter(~ok)
    at_fault = [(names or {}).get(c, c) for c in required if bad[c].null_count()]
    good, bad_rows = (good if keep_row_no else good.drop(row_no)), bad[row_no].to_list()
    why = f" (empty or invalid {', '.join(repr(c) for c in at_fault)})" if at_fault else ""
    report_bad(path, frame.height, bad_rows, "line" if row_no == "line_no" else "row", notes, why, at_fault)
    return good


def read_delimited(
    path: Where,
    separator: str,
    names: Sequence[str],
    dtypes: Mapping[str, DType],
    required: Sequence[str],
    keep_line_no: bool = False,
    notes: dict[str, Any] | None = None,
) -> pl.DataFrame:
    """A headerless file with a (possibly multi-character) separator, e.g. MovieLens ``::`` or ``|``.

    Columns not in ``dtypes`` stay strings. Lines with the wrong number of fields or uncastable
    required fields are skipped and reported (and counted in ``notes``); blank lines are ignored.
    """
    lines = read_lines(path).filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    parts = lines.with_columns(pl.col("line").str.strip_chars_end("\r").str.split(separator).alias("_f"))
    good_shape = pl.col("_f").list.len() == len(names)
    fields = parts.filter(good_shape).select(
        "line_no", *(pl.col("_f").list.get(k).alias(n) for k, n in enumerate(names))
    )
    good, bad_cast = cast_rows(fields, {n: dtypes[n] for n in names if n in dtypes}, required, keep_row_no=keep_line_no)
    report_bad(
        path,
        lines.height,
        sorted(parts.filter(~good_shape)["line_no"].to_list() + bad_cast),
        notes=notes,
        why=f" (not {len(names)} {separator!r}-separated fields, or an empty or invalid "
        f"{', '.join(repr(c) for c in required)})",
    )
    return good


def iter_json_lines(path: Where) -> Iterator[tuple[int, dict | None]]:
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


def records_frame(
    path: Where,
    extract: Callable[[dict], dict | None],
    schema: Mapping[str, DType],
    notes: dict[str, Any] | None = None,
    needs: str = "a required field",
) -> pl.DataFrame:
    """Map each JSON-lines record through ``extract`` into a typed frame.

    Lines that do not parse and records ``extract`` rejects (returns None: it lacks ``needs``) are skipped,
    reported, and counted apart in ``notes`` with their line numbers.
    """
    rows: list[dict] = []
    unparsed: list[int] = []
    rejected: list[int] = []
    total = 0
    for no, record in iter_json_lines(path):
        total += 1
        row = extract(record) if record is not None else None
        if row is not None:
            rows.append(row)
        else:
            (unparsed if record is None else rejected).append(no)
    report_bad(path, total, sorted(unparsed + rejected))
    if notes is not None:
        _record(notes, path, "lines that are not a JSON object, skipped", unparsed)
        _record(notes, path, f"records without {needs}, skipped", rejected)
    return pl.DataFrame(rows, schema=schema, orient="row")


# ---- checked CSV: the load report ----------------------------------------------------------------
# Line numbers are physical lines of the file, counting from 1, so the header is line 1 and the first
# data row is line 2.

_QUOTED = r'"[^"]*"'  # a quoted field (doubled quotes inside split into adjacent matches, all removed)


def _record(notes: dict[str, Any], path: Where, what: str, lines: Sequence[int]) -> list[int]:
    """Put ``len(lines)`` rows of ``path`` skipped or repaired for ``what`` in a load report (not logged)."""
    shown = sorted(lines)[: SHOWN_BAD_LINES * 2]
    if lines:
        notes[f"{path.name}: {what}"] = {"count": len(lines), "lines": shown}
    return shown


def note(notes: dict[str, Any], path: Where, what: str, lines: Sequence[int]) -> None:
    """Record ``len(lines)`` rows of ``path`` skipped or repaired for ``what`` in a load report, and log it."""
    if not lines:
        return
    shown = _record(notes, path, what, lines)
    log.warning(
        "%s: %s: %d line(s) (file lines, header = line 1): %s%s",
        path,
        what,
        len(lines),
        shown,
        " ..." if len(lines) > len(shown) else "",
    )


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


def read_checked_csv(path: Where, separator: str, notes: dict[str, Any]) -> pl.DataFrame:
    """A headed CSV/TSV as strings plus ``line_no`` (file line, header = 1), by documented rules:
    lines that are not UTF-8 are repaired as Latin-1; lines with more or fewer fields than the header
    are skipped, and so are lines with an unbalanced (odd) number of quotes; each is counted in ``notes``
    with its line numbers. Quoted fields may hold the separator but not a line break (both halves of such
    a row have an unbalanced quote)."""
    raw, repaired = utf8_lines(read_bytes(path))
    lines = pl.read_csv(
        io.BytesIO(raw),
        has_header=False,
        separator="\x1f",
        quote_char=None,
        schema={"line": pl.Utf8},
        truncate_ragged_lines=True,
    ).with_row_index("line_no", offset=1)
    lines = lines.with_columns(pl.col("line").str.strip_chars_end("\r")).filter(
        pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != "")
    )
    if lines.is_empty():
        raise DataFileError(f"{path}: empty file")
    odd = pl.col("line").str.count_matches('"', literal=True) % 2 == 1
    if lines.select(odd.first()).item():
        raise DataFileError(f"{path}: line 1 (the header) has an unbalanced quote")
    note(notes, path, "rows with an unbalanced quote, skipped", lines.filter(odd)["line_no"].to_list())
    lines = lines.filter(~odd)
    fields = pl.col("line").str.replace_all(_QUOTED, "").str.count_matches(separator, literal=True) + 1
    lines = lines.with_columns(_n=fields)
    width = lines["_n"][0]
    body = lines.slice(1)
    note(notes, path, "lines not UTF-8, repaired as Latin-1", repaired)
    note(
        notes,
        path,
        f"rows with more fields than the header's {width}, skipped",
        body.filter(pl.col("_n") > width)["line_no"].to_list(),
    )
    note(
        notes,
        path,
        f"rows with fewer fields than the header's {width}, skipped",
        body.filter(pl.col("_n") < width)["line_no"].to_list(),
    )
    good = body.filter(pl.col("_n") == width)
    text = "\n".join([lines["line"][0], *good["line"].to_list()])
    try:
        frame = pl.read_csv(io.BytesIO(text.encode()), separator=separator, infer_schema=False)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{path}: unreadable CSV ({err})") from err
    if frame.height != good.height:
        raise DataFileError(
            f"{path}: {good.height} rows checked but {frame.height} parsed; a quoted field probably holds a line break"
        )
    return frame.with_columns(good["line_no"])


def drop_unknown_items(
    inter: pl.DataFrame, items: pl.DataFrame, path: Where, notes: dict[str, Any], line_col: str = "line_no"
) -> pl.DataFrame:
    """Interactions whose item is in ``items`` (the catalogue); the others are skipped and counted. When
    none is, the load stops naming the file and the column (ids that do not match between the files)."""
    known = pl.col("item_id").is_in(items["item_id"].implode())
    if inter.height and not inter.select(known.any()).item():
        raise DataFileError(
            f"{path}: column 'item_id': none of the {inter.height} interactions names an item of "
            f"the items file (e.g. {inter['item_id'][0]!r}; items are e.g. "
            f"{items['item_id'].head(3).to_list()})"
        )
    note(
        notes,
        path,
        "interactions with items missing from the items file, skipped",
        inter.filter(~known)[line_col].to_list(),
    )
    return inter.filter(known)


# ---- ids and JSON-lines tables: one row at a time ------------------------------------------------


def _label(column: str, source: str | None) -> str:
    """``'item_id'``, or ``item_id (column 'iid')`` when the file names it otherwise."""
    return f"{column} (column {source!r})" if source and source != column else repr(column)


def id_text(frame: pl.DataFrame, column: str, path: Where, source: str | None = None) -> pl.DataFrame:
    """``column`` as id text, the same whatever a file typed it as: integers and whole floats (an integer
    column with gaps, as pandas writes it) without a decimal point, text stripped; empty is null. A column
    of lists or records holds no ids: ``DataFileError`` naming the file and column."""
    dtype = frame.schema[column]
    col = pl.col(column)
    if dtype.is_nested():
        raise DataFileError(f"{path}: column {_label(column, source)} holds {dtype} values, not ids")
    if dtype.is_float():
        whole = col.is_finite() & (col == col.floor())
        text = pl.when(whole).then(col.cast(pl.Int64, strict=False).cast(pl.Utf8)).otherwise(col.cast(pl.Utf8))
    else:
        text = col.cast(pl.Utf8).str.strip_chars()
    return frame.with_columns(pl.when(text != "").then(text).alias(column))


def drop_empty_ids(
    frame: pl.DataFrame, column: str, path: Where, notes: dict[str, Any], line_col: str, source: str | None = None
) -> pl.DataFrame:
    """Ids normalised (:func:`id_text`); rows without one skipped and counted in ``notes`` by file line. A
    file where more than half the rows have none stops the load, naming the file and the column."""
    frame = id_text(frame, column, path, source)
    empty = frame.filter(pl.col(column).is_null())
    if empty.height > MAX_BAD_FRACTION * frame.height:
        first = ", ".join(str(n) for n in empty[line_col].head(SHOWN_BAD_LINES).to_list())
        raise DataFileError(
            f"{path}: column {_label(column, source)}: {empty.height} of {frame.height} rows have "
            f"no {column} (first at line {first}); is it the right column?"
        )
    note(notes, path, f"rows with an empty {_label(column, source)}, skipped", empty[line_col].to_list())
    return frame.filter(pl.col(column).is_not_null())


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else "record" if isinstance(value, dict) else "value"


def _uniform(records: list[dict], column: str) -> None:
    """Make ``column`` one type across ``records`` (in place): single values beside lists become one-item
    lists; a column with records (JSON objects) becomes JSON text."""
    kinds = {_kind(r[column]) for r in records if r.get(column) is not None}
    if len(kinds) < 2:
        return
    for r in records:
        value = r.get(column)
        if value is None:
            continue
        if "record" in kinds:
            r[column] = value if isinstance(value, str) else json.dumps(value)
        elif not isinstance(value, list):
            r[column] = [value]


def read_json_table(path: Where, line_col: str, notes: dict[str, Any]) -> pl.DataFrame:
    """A JSON-lines table, one record a line, with ``line_col`` (file line). Lines that are not a JSON object
    are skipped and counted in ``notes``; a column whose values differ in kind across lines is made uniform
    (:func:`_uniform`); ids typed as numbers on some lines and text on others come out as text."""
    records: list[dict] = []
    numbers: list[int] = []
    bad: list[int] = []
    for no, record in iter_json_lines(path):
        if record is None:
            bad.append(no)
        else:
            records.append(record)
            numbers.append(no)
    report_bad(path, len(records) + len(bad), bad)
    _record(notes, path, "lines that are not a JSON object, skipped", bad)
    for column in dict.fromkeys(k for r in records for k in r):
        _uniform(records, column)
    try:
        frame = pl.DataFrame(records, infer_schema_length=None, strict=False)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{path}: unreadable JSON lines ({err})") from err
    return frame.with_columns(pl.Series(line_col, numbers, dtype=pl.UInt32))
