"""Arrow tables as polars frames, typed: ``pl.from_arrow`` may return a Series; a table is always a frame."""

from __future__ import annotations

import polars as pl
import pyarrow as pa


def as_frame(table: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """``table`` (or one record batch) as a polars DataFrame (zero-copy where polars can)."""
    frame = pl.from_arrow(table)
    if not isinstance(frame, pl.DataFrame):  # only an Arrow array converts to a Series
        raise TypeError(f"expected an Arrow table, got {type(table).__name__}")
    return frame
