"""Step 2 of the knowledge job: route every user and item to a pool group (collaborative or attribute); the
pools of the groups are step 3 (pipelines/knowledge/pool_build.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from pipelines.config import JobConfig
from pipelines.store.frames import as_frame
from pipelines.knowledge.accounting import lightgcn_notes, pool_kind_notes
from pipelines.knowledge.inputs import JobData
from pipelines.knowledge.own_embeddings import fingerprint, own_vectors
from pipelines.knowledge.paths import JobPaths
from pipelines.store.location import atomic_write_local

if TYPE_CHECKING:
    from router import Embeddings

log = logging.getLogger(__name__)


USER_ATTRIBUTES = ("gender", "age", "occupation")
ITEM_ATTRIBUTES = ("category", "sub_category", "genres", "year")


def _attribute_frame(
    table: pl.DataFrame, id_column: str, candidates: tuple[str, ...]
) -> tuple[pl.DataFrame, list[str]]:
    """The table and the attribute hierarchy it supports; a constant "all" group when it has none."""
    hierarchy = [c for c in candidates if c in table.columns]
    if not hierarchy:
        return table.select(id_column, all=pl.lit("all")), ["all"]
    return table, hierarchy


def _attribute_groups(cfg: JobConfig, data: JobData) -> dict[str, pl.DataFrame]:
    """Per entity type, the attribute groups of every user and item (the hierarchy the table supports)."""
    import router

    rc, out = cfg.routing, {}
    for etype, table, id_col, cands in (
        ("user", data.dataset.users, "user_id", USER_ATTRIBUTES),
        ("item", data.dataset.items, "item_id", ITEM_ATTRIBUTES),
    ):
        frame, hierarchy = _attribute_frame(table, id_col, cands)
        grouping = router.AttributeGrouping(
            hierarchy=hierarchy, max_group_size=rc.max_group_size, bucket_widths={"age": 10, "year": 10}, seed=rc.seed
        )
        out[etype] = router.attribute_groups(frame, grouping, id_col)
    return out


def _lightgcn_vectors(cfg: JobConfig, data: JobData, write: bool) -> dict[str, Embeddings | None]:
    """LightGCN's user and item vectors (None when it could not train); with ``write`` its parameters are
    kept as the next run's warm start."""
    import router

    split, rc = data.split, cfg.routing
    implicit = cfg.dataset.feedback == "implicit"  # positives: weight > 0 (or >= min_positive_weight)
    lg = router.LightGCNConfig(
        positive_threshold=cfg.dataset.min_positive_weight if implicit else cfg.dataset.min_positive_rating,
        positive_column="weight" if implicit else "rating",
        seed=rc.seed,
        progress=False,
        **rc.lightgcn,
    )
    warm = JobPaths.of(cfg).work / "lightgcn"  # the last run's LightGCN parameters: this run's warm start
    try:
        emb = router.train_lightgcn(split.routing_interactions, lg, init=router.WarmStart.load(warm))
        if write and emb.layer0 is not None:  # a result without its parameters has no warm start to keep
            emb.layer0.save(warm)
    except ValueError as exc:  # e.g. no positive interaction at all: every entity goes to its attribute pool
        log.warning("LightGCN skipped (%s); collaborative groups unavailable", exc)
        emb = None
    data.dataset.notes.update(lightgcn_notes(emb.best_recall if emb is not None else None))
    return {"user": emb.users if emb else None, "item": emb.items if emb else None}


def groups_of(cfg: JobConfig, data: JobData, write: bool = True) -> dict[str, tuple[pl.DataFrame, pl.DataFrame | None]]:
    """Per entity type: (attribute groups, collaborative groups or None), over every user and item. The
    collaborative groups cluster the team's vectors (``routing.embeddings``) or else LightGCN's."""
    import router

    rc = cfg.routing
    vectors_of = own_vectors(cfg, data) if rc.embeddings is not None else _lightgcn_vectors(cfg, data, write)
    out = {}
    for etype, attr in _attribute_groups(cfg, data).items():
        vectors = vectors_of[etype]
        collab = None
        uses_collab = (rc.user_policy if etype == "user" else rc.item_policy) != "attribute"
        if uses_collab and vectors is not None and len(vectors) > 0:  # no unused (empty) collaborative pools
            collab = router.collaborative_groups(  # n_clusters groups, more when they would pass the target size
                vectors, min(rc.n_clusters, len(vectors)), rc.target_group_size, seed=rc.seed
            )
        out[etype] = (attr, collab)
    return out


def step_route(cfg: JobConfig, data: JobData, write: bool = True, incremental: bool = False) -> pl.DataFrame:
    """Step 2: route every user and item; with ``write`` (not in a dry run) the routing table and the group
    memberships are saved as Parquet, and LightGCN's parameters for the next run. An ``incremental`` run keeps
    the last routing while few interactions are new (:func:`kept_routing`)."""
    import router

    paths = JobPaths.of(cfg)
    if incremental and write:
        kept = kept_routing(cfg, data)
        if kept is not None:
            return kept
    groups = groups_of(cfg, data, write)
    old = data.split.routing_interactions
    policies = {"user": cfg.routing.user_policy, "item": cfg.routing.item_policy}
    tables, members = [], []
    for etype, (attr, collab) in groups.items():
        counts = router.interaction_counts(old, f"{etype}_id")
        tables.append(
            router.route(
                etype,
                attr["entity_id"].to_list(),
                attr,
                collab,
                counts,
                policy=policies[etype],
                warm_threshold=cfg.routing.warm_threshold,
            )
        )
        members.append(router.group_memberships(etype, attr, collab))
    table = pa.concat_tables(tables)
    if write:
        router.write_routing(table, paths.routing)
        router.write_routing(pa.concat_tables(members), paths.memberships)
        _save_routed(paths, data.split.routing_interactions, fingerprint(cfg))
    frame = as_frame(table)
    data.dataset.notes.update(pool_kind_notes(frame, policies))
    counts = {
        f"{t}/{k}": n for t, k, n in frame.group_by("entity_type", "pool_kind").len().sort("entity_type").iter_rows()
    }
    log.info("routing: %s%s", counts, f" -> {paths.routing}" if write else " (dry run: not saved)")
    return frame


ROUTED = "routed.json"  # in the work folder: what the saved routing was learned from


def _save_routed(paths: JobPaths, interactions: pl.DataFrame, embeddings: str | None) -> None:
    """``embeddings``: the fingerprint of routing.embeddings' files (None: LightGCN's vectors)."""
    watermark = interactions["timestamp"].max() if interactions.height else None
    info = {"interactions": interactions.height, "watermark": watermark, "embeddings": embeddings}
    atomic_write_local(paths.work / ROUTED, lambda tmp: Path(tmp).write_text(json.dumps(info, default=str)))


def kept_routing(cfg: JobConfig, data: JobData) -> pl.DataFrame | None:
    """The last run's routing, kept when at most ``routing.retrain_share`` of today's interactions are newer
    than the ones it was learned from and routing.embeddings' files are unchanged (:func:`fingerprint`):
    LightGCN and K-means do not run. Entities it lacks (new users and items)
    are routed to their attribute group and added to the routing and membership tables. None: route afresh."""
    import router

    paths = JobPaths.of(cfg)
    if not (paths.work / ROUTED).exists() or not paths.routing.exists() or not paths.memberships.exists():
        return None
    info = json.loads((paths.work / ROUTED).read_text())
    if info.get("embeddings") != fingerprint(cfg):
        log.info("routing: routing.embeddings or its files changed since the last routing: routed afresh")
        return None
    interactions = data.split.routing_interactions
    newer = (
        interactions.filter(pl.col("timestamp") > info["watermark"]).height
        if info["watermark"] is not None
        else interactions.height
    )
    share = newer / max(1, interactions.height)
    if share > cfg.routing.retrain_share:
        log.info(
            "routing: %.1f%% of the interactions are new since the last routing (> routing.retrain_share "
            "%.0f%%): routed afresh",
            100 * share,
            100 * cfg.routing.retrain_share,
        )
        return None
    routing, members = as_frame(router.read_routing(paths.routing)), router.read_routing(paths.memberships)
    added, added_members = [], []
    for etype, attr in _attribute_groups(cfg, data).items():
        fresh = attr.join(
            routing.filter(pl.col("entity_type") == etype).select(entity_id="entity_id"), on="entity_id", how="anti"
        )
        if fresh.height:
            added.append(router.route(etype, fresh["entity_id"].to_list(), fresh, None, {}, policy="attribute"))
            added_members.append(router.group_memberships(etype, fresh, None))
    if added:
        routing = pl.concat([routing, as_frame(pa.concat_tables(added))], how="vertical_relaxed")
        router.write_routing(routing.to_arrow(), paths.routing)
        router.write_routing(pa.concat_tables([members, *added_members]), paths.memberships)
    log.info(
        "routing: kept from the last run (%.1f%% of the interactions new, routing.retrain_share %.0f%%); "
        "%d new entities routed to their attribute group",
        100 * share,
        100 * cfg.routing.retrain_share,
        sum(t.num_rows for t in added),
    )
    data.dataset.notes.update(
        pool_kind_notes(routing, {"user": cfg.routing.user_policy, "item": cfg.routing.item_policy})
    )
    return routing


def read_routing(cfg: JobConfig) -> pl.DataFrame:
    """The routing table a previous `route` step saved."""
    import router

    path = JobPaths.of(cfg).routing
    if not path.exists():
        raise FileNotFoundError(f"{path}: no routing table; run `laser route` (or `laser run`) first")
    return as_frame(router.read_routing(path))
