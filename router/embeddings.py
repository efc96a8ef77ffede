"""Entity embeddings (ids + matrix): the validated container, saving and loading them as Parquet.

Teams that already train a recommender can skip LightGCN and hand its vectors in: one Parquet file with
an id column and a vector column (list or fixed-size list of floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from laser.files import atomic_write

_SHOW = 5  # how many offending ids an error message names


class EmbeddingError(ValueError):
    """Embeddings that cannot be used: duplicate ids, NaN/inf values or rows of the wrong width."""


def _name_some(ids: list[str]) -> str:
    more = f" (and {len(ids) - _SHOW} more)" if len(ids) > _SHOW else ""
    return ", ".join(repr(i) for i in ids[:_SHOW]) + more


@dataclass(frozen=True)
class Embeddings:
    """One vector per entity: ``vectors[i]`` belongs to ``ids[i]``.

    Validated on construction: ids unique strings, ``vectors`` a finite float matrix ``[len(ids), dim]``.
    """

    ids: list[str]
    vectors: np.ndarray  # [n, dim] float32

    def __post_init__(self) -> None:
        vectors = np.asarray(self.vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(self.ids):
            raise EmbeddingError(f"vectors must have shape [{len(self.ids)}, dim], got {vectors.shape}")
        dupes = pl.Series(self.ids, dtype=pl.Utf8).filter(pl.Series(self.ids, dtype=pl.Utf8).is_duplicated())
        if len(dupes):
            raise EmbeddingError(f"duplicate ids: {_name_some(sorted(set(dupes.to_list())))}")
        bad_rows = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
        if bad_rows.size:
            raise EmbeddingError(f"NaN or infinite values for ids: {_name_some([self.ids[i] for i in bad_rows])}")
        object.__setattr__(self, "vectors", vectors)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, ids: list[str]) -> Embeddings:
        """The rows for ``ids`` (in that order); unknown ids are an error naming them."""
        position = {e: i for i, e in enumerate(self.ids)}
        unknown = [e for e in ids if e not in position]
        if unknown:
            raise EmbeddingError(f"no embedding for ids: {_name_some(unknown)}")
        return Embeddings(list(ids), self.vectors[[position[e] for e in ids]])


def save_embeddings(
    embeddings: Embeddings, path: str | Path, id_column: str = "id", vector_column: str = "embedding"
) -> None:
    """Write ``embeddings`` to ``path`` (Parquet, the layout :func:`load_embeddings` reads), atomically."""
    frame = pl.DataFrame(
        {
            id_column: pl.Series(embeddings.ids, dtype=pl.Utf8),
            vector_column: pl.Series(embeddings.vectors, dtype=pl.Array(pl.Float32, embeddings.dim)),
        }
    )
    atomic_write(path, frame.write_parquet)


def load_embeddings(
    path: str | Path, id_column: str = "id", vector_column: str = "embedding", dim: int | None = None
) -> Embeddings:
    """Read ``path`` (a local Parquet file) into validated :class:`Embeddings`.

    Every vector must have the same width (``dim`` when given, else the first row's); ids are cast to
    strings. Errors name the file, the column and the offending ids.
    """
    path = Path(path)
    return embeddings_from_frame(pl.read_parquet(path), str(path), id_column, vector_column, dim)


def embeddings_from_frame(
    frame: pl.DataFrame, label: str, id_column: str = "id", vector_column: str = "embedding", dim: int | None = None
) -> Embeddings:
    """Validated :class:`Embeddings` from a table already read (``label``: the file named in errors), checked
    as :func:`load_embeddings` checks a file."""
    path = label
    for column in (id_column, vector_column):
        if column not in frame.columns:
            raise EmbeddingError(f"{path}: no column {column!r} (columns: {frame.columns})")
    ids = frame[id_column].cast(pl.Utf8)
    vectors = frame[vector_column]
    if isinstance(vectors.dtype, pl.Array):
        vectors = vectors.cast(pl.List(vectors.dtype.inner))
    if not isinstance(vectors.dtype, pl.List):
        raise EmbeddingError(f"{path}: column {vector_column!r} must hold lists of floats, got {vectors.dtype}")
    missing = (ids.is_null() | vectors.is_null()).arg_true().to_list()
    if missing:
        raise EmbeddingError(
            f"{path}: missing id or vector in rows {missing[:_SHOW]} "
            f"(ids: {_name_some([str(ids[i]) for i in missing])})"
        )
    widths = vectors.list.len()
    expected = dim if dim is not None else (int(widths[0]) if len(widths) else 0)
    wrong = ids.filter(widths != expected).to_list()
    if wrong:
        raise EmbeddingError(
            f"{path}: column {vector_column!r} must have width {expected}; wrong width for ids: {_name_some(wrong)}"
        )
    matrix = np.asarray(vectors.explode().cast(pl.Float32).to_numpy(), dtype=np.float32).reshape(len(ids), expected)
    try:
        return Embeddings(ids.to_list(), matrix)
    except EmbeddingError as exc:
        raise EmbeddingError(f"{path}: {exc}") from None
