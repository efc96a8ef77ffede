"""Building retrieval pools from old knowledge: one per group, plus the global (ReSD) and random (RRP) pools.

Inputs:
- **old knowledge**: an Arrow table or Parquet file/directory with ``entity_type``, ``entity_id`` and either
  ``knowledge`` (text, tokenised here) or ``token_ids`` (list of ints). Several rows per entity (several
  runs) are several texts.
- **memberships**: a table in the routing-table schema (``entity_type, entity_id, pool_kind, group_id``).
  Pass ``router.group_memberships(...)`` (every group of every entity, so attribute pools also hold warm
  entities' knowledge) or a routing table.

Pools are keyed ``f"{entity_type}/{pool_kind}/{group_id}"``. Each group pool is capped at
``max_pool_size`` texts: those whose seeded hash of (pool, entity) ranks lowest, so the picks stay put as
members come and go. ``"{type}/global/all"`` holds a type's old knowledge (ReSD baseline; capped at
``global_max_size``, built only when asked); ``"{type}/random/{kind}.{group}"`` is a seeded random sample of the
type's knowledge of the same size as the group pool ``{type}/{kind}/{group}`` (the paper's RRP ablation).
Rows with empty knowledge are skipped with a recorded reason; groups without any knowledge are listed in
``empty_groups`` and get no pool.
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from pools.retrieval import RetrievalPool

log = logging.getLogger(__name__)

TEXT_COLUMN, TOKENS_COLUMN = "knowledge", "token_ids"
MEMBERSHIP_COLUMNS = ("entity_type", "entity_id", "pool_kind", "group_id")


def group_key(entity_type: str, pool_kind: str, group_id: str) -> str:
    """The key of a pool: ``"user/collaborative/3"``."""
    return f"{entity_type}/{pool_kind}/{group_id}"


@dataclass
class PoolBuildConfig:
    """Pool sizes and which baseline pools to build."""

    max_pool_size: int | None = 2000  # texts per group pool (paper grid 500-5000); None = no cap
    global_max_size: int | None = None  # texts in each global pool; None = all old knowledge
    with_groups: bool = True  # the group pools (a decoder drafting from the global pool needs none)
    with_global: bool = True
    with_random: bool = False
    on_missing: str = "error"  # knowledge of an entity with no group: "error" or "skip"
    seed: int = 0


@dataclass
class PoolSources:
    """Token-id texts per pool key: what a pool is built from, and what the store persists."""

    texts: dict[str, list[list[int]]]
    empty_groups: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (entity_type, entity_id, reason)

    def sizes(self) -> dict[str, int]:
        return {key: len(texts) for key, texts in self.texts.items()}


def read_knowledge_texts(source: pa.Table | str | Path) -> pa.Table:
    """Old knowledge as an Arrow table (a Parquet file, a directory of Parquet files, or a table), checked."""
    if isinstance(source, pa.Table):
        table, name = source, "knowledge table"
    else:
        path = Path(source)
        files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"{path}: no Parquet files")
        table, name = ds.dataset([str(f) for f in files], format="parquet").to_table(), str(path)
    missing = [c for c in ("entity_type", "entity_id") if c not in table.column_names]
    if missing or not {TEXT_COLUMN, TOKENS_COLUMN} & set(table.column_names):
        raise ValueError(
            f"{name}: needs entity_type, entity_id and {TEXT_COLUMN!r} or {TOKENS_COLUMN!r} "
            f"columns (has {table.column_names})"
        )
    return table


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` without special tokens (one batched call to a Hugging Face tokenizer)."""
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def _polars(table: pa.Table) -> pl.DataFrame:
    """``table`` as a polars DataFrame (``pl.from_arrow`` gives a Series only for an Arrow array)."""
    frame = pl.from_arrow(table)
    if not isinstance(frame, pl.DataFrame):
        raise TypeError(f"expected an Arrow table, got {type(table).__name__}")
    return frame


def _frame(knowledge: pa.Table) -> tuple[pl.DataFrame, str]:
    """(entity_type, entity_id, content) with the row order kept, and which content column it holds."""
    column = TOKENS_COLUMN if TOKENS_COLUMN in knowledge.column_names else TEXT_COLUMN
    frame = _polars(knowledge.select(["entity_type", "entity_id", column]))
    return frame.with_columns(pl.col("entity_id").cast(pl.Utf8), _row=pl.int_range(pl.len())), column


def _is_empty(column: str) -> pl.Expr:
    if column == TOKENS_COLUMN:
        return pl.col(column).is_null() | (pl.col(column).list.len() == 0)
    return pl.col(column).is_null() | (pl.col(column).str.strip_chars() == "")


def _member_frame(memberships: pa.Table) -> pl.DataFrame:
    """Memberships keyed by pool, in table order; a member without a pool_kind or group is named."""
    missing = [c for c in MEMBERSHIP_COLUMNS if c not in memberships.column_names]
    if missing:
        raise ValueError(f"membership/routing table lacks column(s) {missing}")
    frame = _polars(memberships.select(list(MEMBERSHIP_COLUMNS))).with_columns(pl.col("entity_id").cast(pl.Utf8))
    bad = frame.filter(pl.col("group_id").is_null() | pl.col("pool_kind").is_null())
    if bad.height:
        raise ValueError(
            f"{bad['entity_type'][0]} {bad['entity_id'][0]!r} has no pool_kind/group_id in the "
            f"membership table ({bad.height} rows)"
        )
    key = pl.concat_str(["entity_type", "pool_kind", "group_id"], separator="/")
    return frame.select("entity_type", "entity_id", pool_key=key, _member=pl.int_range(pl.len()))


def _capped(frame: pl.DataFrame, cap: int | None, seed: int) -> pl.DataFrame:
    """At most ``cap`` rows per pool: those whose seeded hash of (pool, entity) ranks lowest, so a member that
    joins or leaves changes at most one other pick (stable across runs of the same polars version)."""
    if cap is None:
        return frame
    rank = (
        pl.concat_str(["pool_key", "entity_type", "entity_id"], separator="/")
        .hash(seed)
        .rank("ordinal")
        .over("pool_key")
    )
    return frame.filter(rank <= cap)


@dataclass
class Selection:
    """Which texts each pool holds: ``frame`` (pool_key, entity_type, entity_id and the text or its token ids,
    ``column``), sorted by pool key, each pool's texts in membership then knowledge order."""

    frame: pl.DataFrame
    column: str
    empty_groups: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (entity_type, entity_id, reason)

    def sizes(self) -> dict[str, int]:
        return dict(self.frame.group_by("pool_key").len().iter_rows())


def select_texts(
    knowledge: pa.Table | str | Path, memberships: pa.Table, config: PoolBuildConfig | None = None
) -> Selection:
    """The texts of every pool (see the module docstring), as Arrow-backed columns: no Python object per text."""
    config = config or PoolBuildConfig()
    frame, column = _frame(read_knowledge_texts(knowledge))
    empty = frame.filter(_is_empty(column))
    skipped = [(t, e, "empty knowledge") for t, e in empty.select("entity_type", "entity_id").iter_rows()]
    frame = frame.filter(~_is_empty(column))
    members = _member_frame(memberships)
    orphans = (
        frame.join(members, on=["entity_type", "entity_id"], how="anti")
        .unique(["entity_type", "entity_id"])
        .sort("entity_type", "entity_id")
    )
    if orphans.height and config.on_missing == "error":
        shown = ", ".join(f"{t} {e!r}" for t, e in orphans.select("entity_type", "entity_id").head(5).iter_rows())
        raise ValueError(
            f"{orphans.height} entities with old knowledge are missing from the membership/routing "
            f"table: {shown}{' ...' if orphans.height > 5 else ''}"
        )
    skipped += [
        (t, e, "no group in the membership table") for t, e in orphans.select("entity_type", "entity_id").iter_rows()
    ]
    ids = frame.select("entity_type", "entity_id", "_row")  # texts join the selection at the end
    grouped = members.join(ids, on=["entity_type", "entity_id"], how="inner").sort("_member", "_row")
    empty_groups = sorted(set(members["pool_key"].unique()) - set(grouped["pool_key"].unique()))
    if empty_groups:
        log.warning("%d groups have no old knowledge and get no pool: %s", len(empty_groups), empty_groups[:5])
    parts = [_capped(grouped if config.with_groups else grouped.clear(), config.max_pool_size, config.seed)]
    if config.with_global:
        every = ids.sort("entity_type", "entity_id", "_row").with_columns(
            pool_key=pl.concat_str([pl.col("entity_type"), pl.lit("global/all")], separator="/")
        )
        parts.append(_capped(every, config.global_max_size, config.seed))
    columns = ["pool_key", "entity_type", "entity_id", "_row"]
    selected = pl.concat([p.select(columns) for p in parts])
    if config.with_random:
        selected = pl.concat([selected, _random_baselines(parts[0].select(columns), ids, config.seed)])
    selected = selected.sort("pool_key", maintain_order=True).join(
        frame.select("_row", column), on="_row", how="left", maintain_order="left"
    )
    return Selection(selected.drop("_row"), column, empty_groups, skipped)


def _random_baselines(groups: pl.DataFrame, frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """``{type}/random/{kind}.{group}``: a seeded sample of the type's texts, as many as the group pool holds
    (the paper's RRP ablation; research runs, one sample per group)."""
    out = []
    for key, size in groups.group_by("pool_key", maintain_order=True).len().iter_rows():
        entity_type, kind, group = key.split("/", 2)
        pool = frame.filter(pl.col("entity_type") == entity_type).sort("entity_type", "entity_id", "_row")
        random_key = group_key(entity_type, "random", f"{kind}.{group}")
        rng = np.random.default_rng([seed, zlib.crc32(random_key.encode())])
        picks = np.sort(rng.choice(pool.height, size=min(size, pool.height), replace=False))
        out.append(pool[picks].with_columns(pool_key=pl.lit(random_key)).select(groups.columns))
    return pl.concat(out) if out else groups.clear()


def member_hashes(selection: Selection) -> pl.DataFrame:
    """(pool_key, entity_type, entity_id, text_hash) of every selected text: what a later build compares."""
    return selection.frame.select("pool_key", "entity_type", "entity_id", text_hash=pl.col(selection.column).hash(0))


def stale_pools(previous: pl.DataFrame | None, current: pl.DataFrame, refresh_share: float) -> set[str]:
    """The pools of ``current`` (:func:`member_hashes`) to build again: those ``previous`` lacks, and those more
    than ``refresh_share`` of whose texts were added, dropped or changed since (0: any difference)."""
    sizes = current.group_by("pool_key").len()
    if previous is None:
        return set(sizes["pool_key"])
    differ = (
        pl.concat(
            [
                current.join(previous, on=current.columns, how="anti"),
                previous.join(current, on=current.columns, how="anti"),
            ]
        )
        .group_by("pool_key")
        .len("differ")
    )
    known = previous.select("pool_key").unique()
    table = sizes.join(differ, on="pool_key", how="left").join(
        known.with_columns(known=True), on="pool_key", how="left"
    )
    stale = table.filter(pl.col("known").is_null() | (pl.col("differ").fill_null(0) > refresh_share * pl.col("len")))
    return set(stale["pool_key"])


def token_lists(selection: Selection, tokenizer: Any) -> list[list[int]]:
    """The token ids of every selected row (tokenised here when the knowledge is text)."""
    if selection.column == TOKENS_COLUMN:
        return selection.frame[TOKENS_COLUMN].to_list()
    if tokenizer is None:
        raise ValueError(f"knowledge has text ({TEXT_COLUMN!r}) but no tokenizer was given")
    return tokenize(tokenizer, selection.frame[TEXT_COLUMN].to_list())


def collect_sources(
    knowledge: pa.Table | str | Path,
    memberships: pa.Table,
    tokenizer: Any = None,
    config: PoolBuildConfig | None = None,
) -> PoolSources:
    """Every pool's token-id texts in memory (see the module docstring): small catalogues, tools and tests;
    the job builds its pools in parallel from a :class:`Selection` (pipelines/knowledge/pool_build.py)."""
    selection = select_texts(knowledge, memberships, config)
    texts: dict[str, list[list[int]]] = defaultdict(list)
    for key, tokens in zip(selection.frame["pool_key"], token_lists(selection, tokenizer)):
        texts[key].append(list(tokens))
    return PoolSources(dict(texts), selection.empty_groups, selection.skipped)


def materialize(texts: Sequence[Sequence[int]]) -> RetrievalPool:
    """One retrieval pool (token trie) from token-id texts."""
    return RetrievalPool.from_token_ids(texts)


def build_pools(
    knowledge: pa.Table | str | Path,
    memberships: pa.Table,
    tokenizer: Any = None,
    config: PoolBuildConfig | None = None,
) -> dict[str, RetrievalPool]:
    """Every pool as a ``RetrievalPool``, keyed by :func:`group_key`. For persistence use :mod:`pools.store`."""
    sources = collect_sources(knowledge, memberships, tokenizer, config)
    return {key: materialize(texts) for key, texts in sources.texts.items()}
