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
              row_no: str = "line_no") -> tuple[pl.DataFrame, list[int]]:
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
    return cast.filter(ok).drop(row_no), cast.filter(~ok)[row_no].to_list()


def coerce(frame: pl.DataFrame, dtypes: dict[str, pl.DataType], required: Sequence[str], path: Path,
           row_no: str = "line_no") -> pl.DataFrame:
    """``cast_rows`` plus ``report_bad``: the typed good rows of a frame read from ``path``."""
    good, bad = cast_rows(frame, dtypes, required, row_no)
    report_bad(path, frame.height, bad, "line" if row_no == "line_no" else "row")
    return good


def read_delimited(path: Path, separator: str, names: Sequence[str], dtypes: dict[str, pl.DataType],
                   required: Sequence[str]) -> pl.DataFrame:
    """A headerless file with a (possibly multi-character) separator, e.g. MovieLens ``::`` or ``|``.

    Columns not in ``dtypes`` stay strings. Lines with the wrong number of fields or uncastable
    required fields are skipped and reported; blank lines are ignored.
    """
    lines = read_lines(path).filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    parts = lines.with_columns(pl.col("line").str.strip_chars_end("\r").str.split(separator).alias("_f"))
    good_shape = pl.col("_f").list.len() == len(names)
    fields = parts.filter(good_shape).select(
        "line_no", *(pl.col("_f").list.get(k).alias(n) for k, n in enumerate(names)))
    good, bad_cast = cast_rows(fields, {n: dtypes[n] for n in names if n in dtypes}, required)
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
