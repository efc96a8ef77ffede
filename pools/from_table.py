"""Pools from a team's own texts (``laser pools build``): a table whose rows are texts, grouped by a column.

The table is a Parquet file, a folder of Parquet files (hive partitions are columns too), a CSV file or a
folder of CSV files, read lazily with polars: only the text and group columns are read. Each group becomes one
pool keyed ``f"{key_prefix}{group}"`` (the group value's string form: ``3``, ``3.5``, ``comedy``); a request
drafts from it with ``laser.vllm.request_args(pool=KEY, pool_store=DIR)``. Texts are token ids of the model's
tokenizer without special tokens (:func:`pools.build.tokenize`, as the job's pools are), written with the
project's pool store (:mod:`pools.store`), so vLLM's engine process opens it by path.

Memory: the kept rows' text and group values as Arrow strings (about the size of those two columns
uncompressed), plus the token ids of one part of the store (``part_texts`` texts, or one group when larger);
groups are tokenised and written one part at a time. Rows whose text is null or blank, and rows without a
group, are skipped and counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from tqdm.auto import tqdm

from pools.build import tokenize
from pools.store import MANIFEST, TokenizerFingerprint, commit_store, write_part

log = logging.getLogger(__name__)

PART_TEXTS = 50_000  # texts tokenised and written per part file (as the job's build tasks)
_TEXT_TYPES = (pl.String, pl.Categorical, pl.Enum, pl.Null)
_NESTED = (pl.List, pl.Array, pl.Struct, pl.Object)


class TableError(ValueError):
    """A table that cannot become pools; the message is one line naming the file and the column."""


@dataclass
class TableBuild:
    """What ``build_from_table`` wrote: the store's directory, texts per pool, and the rows it left out."""

    directory: Path
    pools: dict[str, int] = field(default_factory=dict)
    rows: int = 0  # rows in the table
    empty_texts: int = 0  # null or blank texts, skipped
    no_group: int = 0  # rows with a null or empty group, skipped
    capped: int = 0  # texts over ``max_pool_size``, left out

    @property
    def texts(self) -> int:
        return sum(self.pools.values())


def table_files(path: Path) -> tuple[list[Path], str]:
    """The files of a table (a Parquet or CSV file, or a folder of them) and their format."""
    if not path.exists():
        raise TableError(f"{path}: no such file or folder")
    if path.is_dir():
        for fmt in ("parquet", "csv"):
            files = sorted(p for p in path.rglob(f"*.{fmt}") if p.is_file())
            if files:
                return files, fmt
        raise TableError(f"{path}: no .parquet or .csv files in this folder")
    return [path], "csv" if path.suffix.lower() in (".csv", ".tsv") else "parquet"


def scan_table(path: str | Path) -> pl.LazyFrame:
    """The table at ``path`` as a lazy frame (CSV columns are all read as strings)."""
    files, fmt = table_files(Path(path))
    sources = [str(f) for f in files]
    if fmt == "csv":
        sep = "\t" if files[0].suffix.lower() == ".tsv" else ","
        return pl.scan_csv(sources, infer_schema=False, separator=sep)
    return pl.scan_parquet(sources, hive_partitioning=Path(path).is_dir())


def _checked(frame: pl.LazyFrame, name: str, text_column: str, group_column: str) -> None:
    """One line for a missing column, a text column that is not text, or a group column that has no string form."""
    try:
        schema = frame.collect_schema()
    except pl.exceptions.PolarsError as exc:
        raise TableError(f"{name}: cannot read the table: {_first_line(exc)}") from None
    for role, column in (("text", text_column), ("group", group_column)):
        if column not in schema:
            raise TableError(f"{name}: no {role} column {column!r}; its columns: {', '.join(schema.names())}")
    if not isinstance(schema[text_column], _TEXT_TYPES):
        raise TableError(
            f"{name}: text column {text_column!r} is {schema[text_column]}, not strings; name the column of the texts"
        )
    if isinstance(schema[group_column], _NESTED):
        raise TableError(f"{name}: group column {group_column!r} is {schema[group_column]}, not a single value per row")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _selected(
    frame: pl.LazyFrame, text_column: str, group_column: str, key_prefix: str, max_pool_size: int | None, seed: int
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(counts of the rows, the kept rows as (key, text) sorted by key, each group in table order)."""
    text = pl.col(text_column).cast(pl.String)
    group = pl.col(group_column).cast(pl.String)
    empty = text.is_null() | (text.str.strip_chars() == "")
    ungrouped = ~empty & (group.is_null() | (group == ""))
    counts = frame.select(rows=pl.len(), empty_texts=empty.sum(), no_group=ungrouped.sum())
    kept = frame.filter(~empty & ~ungrouped).select(key=pl.lit(key_prefix) + group, text=text)
    if max_pool_size is not None:  # the texts whose seeded hash ranks lowest: picks stay put as rows come and go
        kept = kept.filter(pl.col("text").hash(seed).rank("ordinal").over("key") <= max_pool_size)
    return counts, kept.sort("key", maintain_order=True)


def build_from_table(
    table: str | Path,
    text_column: str,
    group_column: str,
    tokenizer: Any,
    out: str | Path,
    *,
    key_prefix: str = "",
    max_pool_size: int | None = None,
    snapshot: bool = False,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    part_texts: int = PART_TEXTS,
    progress: bool = True,
) -> TableBuild:
    """Build the pool store ``out`` from ``table`` (see the module docstring): one pool per group, at most
    ``max_pool_size`` texts each, tokenised with ``tokenizer`` (a Hugging Face tokenizer); ``snapshot`` also saves
    each pool's built trie. :class:`TableError` (one line) on bad input; an earlier store at ``out`` is replaced
    whole, and a folder that holds other files is refused."""
    name, directory = str(table), Path(out)
    if max_pool_size is not None and max_pool_size < 1:
        raise TableError(f"max_pool_size must be at least 1, got {max_pool_size}")
    check_out(directory)
    frame = scan_table(table)
    _checked(frame, name, text_column, group_column)
    counts_q, kept_q = _selected(frame, text_column, group_column, key_prefix, max_pool_size, seed)
    try:
        counts, kept = pl.collect_all([counts_q, kept_q])
    except pl.exceptions.PolarsError as exc:
        raise TableError(f"{name}: cannot read columns {text_column!r}, {group_column!r}: {_first_line(exc)}") from None
    build = TableBuild(directory, **counts.row(0, named=True))
    _check_rows(build, kept.height, name, text_column, group_column)
    sizes = kept.group_by("key", maintain_order=True).len()
    build.pools = dict(zip(sizes["key"].to_list(), sizes["len"].to_list()))
    build.capped = build.rows - build.empty_texts - build.no_group - kept.height
    entries = _write_parts(kept, build.pools, tokenizer, directory, snapshot, part_texts, progress)
    settings = {"text_column": text_column, "group_column": group_column, "key_prefix": key_prefix}
    info = {"source": name, **settings, "max_pool_size": max_pool_size, "seed": seed, **(meta or {})}
    commit_store(directory, entries, TokenizerFingerprint.of(tokenizer), info)
    return build


def check_out(directory: Path) -> None:
    """``directory`` may be new, empty (hidden files aside: a lock) or a pool store (replaced): never a folder of
    other files."""
    if directory.exists() and not directory.is_dir():
        raise TableError(f"{directory}: a file, not a folder for the pool store")
    shown = directory.is_dir() and any(not p.name.startswith(".") for p in directory.iterdir())
    if shown and not (directory / MANIFEST).exists():
        raise TableError(f"{directory}: a folder that is not empty and holds no pool store; choose an empty folder")


def _check_rows(build: TableBuild, kept: int, name: str, text_column: str, group_column: str) -> None:
    if build.rows == 0:
        raise TableError(f"{name}: the table has no rows")
    if kept == 0:
        raise TableError(
            f"{name}: no texts to build pools from ({build.rows} rows: {build.empty_texts} null or empty in "
            f"column {text_column!r}, {build.no_group} without a value in column {group_column!r})"
        )


def _write_parts(
    kept: pl.DataFrame,
    sizes: dict[str, int],
    tokenizer: Any,
    directory: Path,
    snapshot: bool,
    part_texts: int,
    progress: bool,
) -> dict[str, dict[str, Any]]:
    """Each group tokenised in turn; a part file written whenever ``part_texts`` texts are waiting."""
    entries: dict[str, dict[str, Any]] = {}
    waiting: list[tuple[str, list[list[int]]]] = []
    held, offset = 0, 0
    texts = kept["text"]
    with tqdm(total=kept.height, desc="pools: tokenise and write", unit="text", disable=not progress) as bar:
        for key, n in sizes.items():
            waiting.append((key, tokenize(tokenizer, texts.slice(offset, n).to_list())))
            offset, held = offset + n, held + n
            bar.update(n)
            if held >= part_texts:
                entries.update(write_part(directory, waiting, snapshot))
                waiting, held = [], 0
        entries.update(write_part(directory, waiting, snapshot))
    return entries
