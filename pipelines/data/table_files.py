"""Where a table's data can be (format "table"): one file, a folder of Parquet files, a glob
(``events/*.parquet``, ``events/**/*.parquet``) or Hive-partitioned folders (``day=2024-01-01/``: the
partition keys become columns), on the local disk or behind an fsspec URI (``s3://``, ``gs://``,
``memory://``), the filesystems output URIs use (:class:`pipelines.store.location.Location`).

Parquet is read through a pyarrow dataset, only the columns asked for, so memory follows what the job
keeps rather than the files' size. CSV, TSV and JSON lines are read one file at a time, whole, by the
checked readers (pipelines/data/readers.py). Files are read in sorted path order, so "the later row"
(duplicates) and row numbers in the load report count across the files in that order.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from pipelines.data.readers import DataFileError
from pipelines.store.location import Location, is_uri

PARQUET = (".parquet", ".parq", ".pq")
TEXT = (".csv", ".tsv", ".jsonl", ".ndjson")
WILDCARDS = "*?["
HIDDEN = ("_", ".")  # Spark's _SUCCESS, _temporary/, .crc files: never data


@dataclass(frozen=True)
class TableSource:
    """One table's files. ``label`` names it in every message (a local Path as today, else the URI)."""

    label: Path | Location
    fs: Any  # fsspec filesystem
    root: str  # the folder Hive partition keys are read below (a file: its folder)
    files: tuple[str, ...]  # filesystem paths, sorted
    whole: bool  # a folder or a glob (not one named file)

    @property
    def name(self) -> str:
        """The table's name: the file's name, or the folder's (a glob: its fixed folder's)."""
        return posixpath.basename(self.root.rstrip("/")) if self.whole else posixpath.basename(self.files[0])

    @property
    def parquet(self) -> bool:
        return all(_kind(f) == "parquet" for f in self.files)

    @property
    def above(self) -> Location:
        """Where names relative to this table resolve: a file's folder, or the folder above a folder or glob."""
        here = Location(self.fs, self.root)
        return here.parent if self.whole else here

    def local_file(self) -> Path | Location:
        """The one text file, as the checked readers take it (a local Path, else its Location)."""
        if len(self.files) != 1:
            shown = ", ".join(posixpath.basename(f) for f in self.files[:5])
            raise DataFileError(
                f"{self.label}: {len(self.files)} files ({shown}, ...); several files are read as Parquet only: "
                "name one CSV/JSON-lines file, or convert them to Parquet"
            )
        return self.label if not self.whole else _label(Location(self.fs, self.files[0]))


def _kind(path: str) -> str:
    name = posixpath.basename(path).lower().removesuffix(".gz")
    return "parquet" if name.endswith(PARQUET) else "text" if name.endswith(TEXT) else "other"


def _label(loc: Location) -> Path | Location:
    return Path(loc.path) if loc.local else loc


def resolve(base: Location, name: str) -> Location:
    """``name`` (a file, folder or glob) relative to ``base``; an absolute path or a URI as it is."""
    return Location.of(name) if is_uri(name) or Path(name).is_absolute() else base / name


def _data_file(path: str, root: str) -> bool:
    """Not a hidden or bookkeeping file (``_``/``.`` names anywhere below ``root``)."""
    below = path[len(root) :].strip("/").split("/") if path.startswith(root) else [posixpath.basename(path)]
    return not any(part.startswith(HIDDEN) for part in below)


def locate(where: str | Location, key: str = "dataset.path") -> TableSource:
    """The files ``where`` names (``key``: the config key messages name). A path that matches nothing is a
    ``FileNotFoundError`` naming it as written; a folder without Parquet files a ``DataFileError``."""
    loc = where if isinstance(where, Location) else Location.of(where)
    shown = str(where)
    if loc.local:
        loc = Location(loc.fs, os.path.abspath(loc.path))
    try:
        root, files, whole = _list(loc.fs, loc.path)
    except OSError as err:  # permissions, credentials, an unreachable endpoint
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataFileError(f"{key} {shown!r}: cannot list it ({reason})") from err
    if not files and whole and root == loc.path:
        raise DataFileError(
            f"{key} {shown!r} is a directory: set dataset.interactions_file (the interactions table inside "
            "it), or point dataset.path at a folder of Parquet files (it holds none)"
            if key == "dataset.path"
            else f"{key} {shown!r} is a folder without Parquet files (*.parquet)"
        )
    if not files:
        raise FileNotFoundError(f"{key} {shown!r} {'matches no file' if whole else 'does not exist'}")
    return TableSource(_label(loc), loc.fs, root.rstrip("/") or "/", tuple(files), whole)


def _list(fs: Any, path: str) -> tuple[str, list[str], bool]:
    """(partition root, sorted data files, whether a folder or glob) for a file, folder or glob path."""
    if any(c in path for c in WILDCARDS):
        fixed = path[: min(path.index(c) for c in WILDCARDS if c in path)]
        root = fixed if fixed.endswith("/") else posixpath.dirname(fixed)
        found = fs.glob(path, detail=True)
        return root, sorted(p for p, i in found.items() if i.get("type") != "directory" and _data_file(p, root)), True
    if fs.isdir(path):
        return path, sorted(p for p in fs.find(path) if _data_file(p, path) and _kind(p) == "parquet"), True
    return posixpath.dirname(path), [path] if fs.isfile(path) else [], False


def columns_of(src: TableSource) -> list[str]:
    """The Parquet table's columns (Hive partition keys included), read from its files' footers."""
    return list(_dataset(src).schema.names)


def read_parquet(src: TableSource, columns: Sequence[str] | None, row_no: str) -> pl.DataFrame:
    """``columns`` (None: all) of the Parquet table, with ``row_no``: the row's number across the files
    in sorted order, from 1."""
    try:
        table = _dataset(src).to_table(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataFileError(f"{src.label}: unreadable Parquet ({first})") from err
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame.with_row_index(row_no, offset=1)


def _dataset(src: TableSource) -> pads.Dataset:
    arrow_fs = (
        pafs.LocalFileSystem() if Location(src.fs, src.root).local else pafs.PyFileSystem(pafs.FSSpecHandler(src.fs))  # type: ignore[abstract]  # (stubs)
    )
    try:
        return pads.dataset(
            list(src.files), filesystem=arrow_fs, format="parquet", partitioning="hive", partition_base_dir=src.root
        )
    except (pa.ArrowException, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataFileError(f"{src.label}: unreadable Parquet ({first})") from err
