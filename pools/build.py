"""Building retrieval pools from old knowledge: one per group, plus the global (ReSD) and random (RRP) pools.

Inputs:
- **old knowledge**: an Arrow table or Parquet file/directory with ``entity_type``, ``entity_id`` and either
  ``knowledge`` (text, tokenised here) or ``token_ids`` (list of ints). Several rows per entity (several
  runs) are several texts.
- **memberships**: a table in the routing-table schema (``entity_type, entity_id, pool_kind, group_id``).
  Pass ``router.group_memberships(...)`` (every group of every entity, so attribute pools also hold warm
  entities' knowledge) or a routing table.

Pools are keyed ``f"{entity_type}/{pool_kind}/{group_id}"``. Each group pool is capped at
``max_pool_size`` texts by seeded sampling without replacement. ``"{type}/global/all"`` holds all old
knowledge of a type (ReSD baseline); ``"{type}/random/{kind}.{group}"`` is a seeded random sample of the
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
from typing import Any

import numpy as np
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

    max_pool_size: int | None = 2000        # texts per group pool (paper grid 500-5000); None = no cap
    global_max_size: int | None = None      # texts in each global pool; None = all old knowledge
    with_global: bool = True
    with_random: bool = False
    on_missing: str = "error"               # knowledge of an entity with no group: "error" or "skip"
    seed: int = 0


@dataclass
class PoolSources:
    """Token-id texts per pool key: what a pool is built from, and what the store persists."""

    texts: dict[str, list[list[int]]]
    empty_groups: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (entity_type, entity_id, reason)

    def sizes(self) -> dict[str, int]:
        return {key: len(texts) for key, texts in self.texts.items()}


def read_knowledge(source: pa.Table | str | Path) -> pa.Table:
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
        raise ValueError(f"{name}: needs entity_type, entity_id and {TEXT_COLUMN!r} or {TOKENS_COLUMN!r} "
                         f"columns (has {table.column_names})")
    return table


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` without special tokens (one batched call to a Hugging Face tokenizer)."""
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def _texts_by_entity(knowledge: pa.Table, tokenizer: Any, skipped: list) -> dict[tuple[str, str], list[list[int]]]:
    types = knowledge["entity_type"].to_pylist()
    ids = [str(e) for e in knowledge["entity_id"].to_pylist()]
    if TOKENS_COLUMN in knowledge.column_names:
        token_lists = knowledge[TOKENS_COLUMN].to_pylist()
    else:
        if tokenizer is None:
            raise ValueError(f"knowledge has text ({TEXT_COLUMN!r}) but no tokenizer was given")
        raw = knowledge[TEXT_COLUMN].to_pylist()
        keep = [i for i, t in enumerate(raw) if t and t.strip()]
        encoded = dict(zip(keep, tokenize(tokenizer, [raw[i] for i in keep])))
        token_lists = [encoded.get(i) for i in range(len(raw))]
    out: dict[tuple[str, str], list[list[int]]] = defaultdict(list)
    for entity_type, entity_id, tokens in zip(types, ids, token_lists):
        if not tokens:
            skipped.append((entity_type, entity_id, "empty knowledge"))
            continue
        out[(entity_type, entity_id)].append(list(tokens))
    return out


def _sample(texts: list[list[int]], cap: int | None, seed: int, key: str) -> list[list[int]]:
    """At most ``cap`` texts, chosen by a generator seeded from ``seed`` and the pool key, order kept."""
    if cap is None or len(texts) <= cap:
        return texts
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    return [texts[i] for i in np.sort(rng.choice(len(texts), size=cap, replace=False))]


def _members(memberships: pa.Table) -> dict[str, list[tuple[str, str]]]:
    missing = [c for c in MEMBERSHIP_COLUMNS if c not in memberships.column_names]
    if missing:
        raise ValueError(f"membership/routing table lacks column(s) {missing}")
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in memberships.select(list(MEMBERSHIP_COLUMNS)).to_pylist():
        if row["group_id"] is None or row["pool_kind"] is None:
            raise ValueError(f"{row['entity_type']} {row['entity_id']!r} has no pool_kind/group_id in the "
                             f"membership table")
        key = group_key(row["entity_type"], row["pool_kind"], row["group_id"])
        groups[key].append((row["entity_type"], str(row["entity_id"])))
    return groups


def collect_sources(knowledge: pa.Table | str | Path, memberships: pa.Table, tokenizer: Any = None,
                    config: PoolBuildConfig | None = None) -> PoolSources:
    """Gather, cap and key the token-id texts of every pool (see the module docstring)."""
    config = config or PoolBuildConfig()
    skipped: list[tuple[str, str, str]] = []
    by_entity = _texts_by_entity(read_knowledge(knowledge), tokenizer, skipped)
    groups = _members(memberships)
    grouped = {member for members in groups.values() for member in members}
    orphans = sorted(set(by_entity) - grouped)
    if orphans and config.on_missing == "error":
        shown = ", ".join(f"{t} {e!r}" for t, e in orphans[:5])
        raise ValueError(f"{len(orphans)} entities with old knowledge are missing from the membership/routing "
                         f"table: {shown}{' ...' if len(orphans) > 5 else ''}")
    skipped += [(t, e, "no group in the membership table") for t, e in orphans]
    texts: dict[str, list[list[int]]] = {}
    empty: list[str] = []
    for key in sorted(groups):
        gathered = [t for member in groups[key] for t in by_entity.get(member, [])]
        if gathered:
            texts[key] = _sample(gathered, config.max_pool_size, config.seed, key)
        else:
            empty.append(key)
    if empty:
        log.warning("%d groups have no old knowledge and get no pool: %s", len(empty), empty[:5])
    by_type: dict[str, list[list[int]]] = defaultdict(list)
    for (entity_type, _), entity_texts in sorted(by_entity.items()):
        by_type[entity_type].extend(entity_texts)
    baselines: dict[str, list[list[int]]] = {}
    if config.with_random:
        for key, group_texts in texts.items():
            entity_type, kind, group = key.split("/", 2)
            random_key = group_key(entity_type, "random", f"{kind}.{group}")
            baselines[random_key] = _sample(by_type[entity_type], len(group_texts), config.seed, random_key)
    if config.with_global:
        for entity_type, all_texts in by_type.items():
            global_key = group_key(entity_type, "global", "all")
            baselines[global_key] = _sample(all_texts, config.global_max_size, config.seed, global_key)
    return PoolSources({**texts, **baselines}, empty, skipped)


def materialize(texts: list[list[int]]) -> RetrievalPool:
    """One retrieval pool (token trie) from token-id texts."""
    return RetrievalPool.from_token_ids(texts)


def build_pools(knowledge: pa.Table | str | Path, memberships: pa.Table, tokenizer: Any = None,
                config: PoolBuildConfig | None = None) -> dict[str, RetrievalPool]:
    """Every pool as a ``RetrievalPool``, keyed by :func:`group_key`. For persistence use :mod:`pools.store`."""
    sources = collect_sources(knowledge, memberships, tokenizer, config)
    return {key: materialize(texts) for key, texts in sources.texts.items()}
