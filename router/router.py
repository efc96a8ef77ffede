"""The binary router: which retrieval pool (collaborative or attribute group) serves each user/item.

The routing table is an Arrow table, one row per entity:
``entity_type, entity_id, pool_kind ("collaborative" | "attribute"), group_id, reason``.

Policies: ``"warm_cold"`` (default; at least ``warm_threshold`` interactions -> collaborative, fewer ->
attribute), ``"collaborative"`` (always), ``"attribute"`` (always), or a callable taking an
:class:`EntityInfo` and returning a pool kind (or ``(pool_kind, reason)``). Whatever the policy says, an
entity without a collaborative group (no embedding) is routed to its attribute group and the reason
says so. Every entity must have an attribute group: that is the fallback that always exists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from laser.files import atomic_write

COLLABORATIVE, ATTRIBUTE = "collaborative", "attribute"
POOL_KINDS = (COLLABORATIVE, ATTRIBUTE)
ROUTING_SCHEMA = pa.schema(
    [
        ("entity_type", pa.string()),
        ("entity_id", pa.string()),
        ("pool_kind", pa.string()),
        ("group_id", pa.string()),
        ("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class EntityInfo:
    """What a routing policy sees about one entity."""

    entity_type: str
    entity_id: str
    n_interactions: int
    collaborative_group: str | None
    attribute_group: str


Policy = str | Callable[[EntityInfo], "str | tuple[str, str]"]


def interaction_counts(interactions: pl.DataFrame, id_column: str) -> dict[str, int]:
    """Number of interactions per ``id_column`` value ("user_id" or "item_id")."""
    counts = interactions.group_by(pl.col(id_column).cast(pl.Utf8)).len()
    return dict(zip(counts[id_column].to_list(), counts["len"].to_list()))


def _decide(info: EntityInfo, policy: Policy, warm_threshold: int) -> tuple[str, str]:
    if callable(policy):
        answer = policy(info)
        kind, reason = answer if isinstance(answer, tuple) else (answer, "custom policy")
        if kind not in POOL_KINDS:
            raise ValueError(
                f"routing policy returned {kind!r} for {info.entity_type} {info.entity_id!r}; "
                f"expected one of {POOL_KINDS}"
            )
        return kind, reason
    if policy == "warm_cold":
        if info.n_interactions >= warm_threshold:
            return COLLABORATIVE, f"warm: {info.n_interactions} >= {warm_threshold} interactions"
        return ATTRIBUTE, f"cold: {info.n_interactions} < {warm_threshold} interactions"
    if policy in POOL_KINDS:
        return policy, f"policy: always {policy}"
    raise ValueError(f"unknown routing policy {policy!r}; use 'warm_cold', 'collaborative', 'attribute' or a callable")


def _group_map(groups: pl.DataFrame | None, what: str) -> dict[str, str]:
    """``entity_id -> group_id``; group frames may cover more entities than are routed."""
    if groups is None:
        return {}
    ids = groups["entity_id"].cast(pl.Utf8)
    dupes = ids.filter(ids.is_duplicated()).unique().sort().to_list()
    if dupes:
        raise ValueError(f"{what} groups list these entities more than once: {dupes[:5]}")
    return dict(zip(ids.to_list(), groups["group_id"].cast(pl.Utf8).to_list()))


def route(
    entity_type: str,
    entity_ids: Sequence[str],
    attribute: pl.DataFrame,
    collaborative: pl.DataFrame | None = None,
    counts: Mapping[str, int] | None = None,
    policy: Policy = "warm_cold",
    warm_threshold: int = 5,
) -> pa.Table:
    """Route every id of ``entity_ids`` to one pool; returns the routing table (see module docstring).

    ``attribute`` / ``collaborative`` are group frames ``(entity_id, group_id)`` from :mod:`router.groups`;
    ``counts`` maps ids to their number of interactions (missing -> 0).
    """
    ids = [str(e) for e in entity_ids]
    if len(set(ids)) != len(ids):
        dupes = sorted(e for e, n in Counter(ids).items() if n > 1)
        raise ValueError(f"entity ids to route are duplicated: {dupes[:5]}")
    attr = _group_map(attribute, "attribute")
    collab = _group_map(collaborative, "collaborative")
    no_attr = [e for e in ids if e not in attr]
    if no_attr:
        raise ValueError(
            f"{len(no_attr)} {entity_type}s have no attribute group (the fallback every entity needs): {no_attr[:5]}"
        )
    counts = counts or {}
    rows: dict[str, list[str | None]] = {name: [] for name in ROUTING_SCHEMA.names}
    for entity_id in ids:
        info = EntityInfo(entity_type, entity_id, int(counts.get(entity_id, 0)), collab.get(entity_id), attr[entity_id])
        kind, reason = _decide(info, policy, warm_threshold)
        if kind == COLLABORATIVE and info.collaborative_group is None:
            kind, reason = ATTRIBUTE, f"{reason}; no embedding, fell back to attribute"
        group = info.collaborative_group if kind == COLLABORATIVE else info.attribute_group
        for name, value in zip(ROUTING_SCHEMA.names, (entity_type, entity_id, kind, group, reason)):
            rows[name].append(value)
    return pa.table(rows, schema=ROUTING_SCHEMA)


def group_memberships(entity_type: str, attribute: pl.DataFrame, collaborative: pl.DataFrame | None = None) -> pa.Table:
    """Every group each entity belongs to (both kinds), in the routing-table schema.

    Pools are built from memberships, not from the routing table: an attribute pool must hold the old
    knowledge of every entity with that attribute (warm ones included), since the cold entities routed
    to it have little or none of their own.
    """
    parts = [(ATTRIBUTE, attribute)] + ([(COLLABORATIVE, collaborative)] if collaborative is not None else [])
    frames = [
        g.select(
            pl.lit(entity_type).alias("entity_type"),
            pl.col("entity_id").cast(pl.Utf8),
            pl.lit(kind).alias("pool_kind"),
            pl.col("group_id").cast(pl.Utf8),
            pl.lit("membership").alias("reason"),
        )
        for kind, g in parts
    ]
    return pl.concat(frames).to_arrow().cast(ROUTING_SCHEMA)


def write_routing(table: pa.Table, path: str | Path) -> Path:
    """Write a routing table to Parquet atomically (temp file + rename)."""
    path = Path(path)
    missing = [n for n in ROUTING_SCHEMA.names if n not in table.column_names]
    if missing:
        raise ValueError(f"routing table lacks column(s) {missing}")
    return atomic_write(path, lambda tmp: pq.write_table(table.select(ROUTING_SCHEMA.names).cast(ROUTING_SCHEMA), tmp))


def read_routing(path: str | Path) -> pa.Table:
    """Read a routing table written by :func:`write_routing` (schema checked)."""
    table = pq.read_table(path)
    missing = [n for n in ROUTING_SCHEMA.names if n not in table.column_names]
    if missing:
        raise ValueError(f"{path}: routing table lacks column(s) {missing}")
    return table.select(ROUTING_SCHEMA.names).cast(ROUTING_SCHEMA)
