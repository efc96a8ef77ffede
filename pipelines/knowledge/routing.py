"""Step 2 of the knowledge job: route every user and item to a pool group (collaborative or attribute); the
pools of the groups are step 3 (pipelines/knowledge/pool_build.py)."""
from __future__ import annotations

import logging

import polars as pl
import pyarrow as pa

from pipelines.config import JobConfig
from pipelines.knowledge.accounting import lightgcn_notes, pool_kind_notes
from pipelines.knowledge.inputs import JobData
from pipelines.knowledge.paths import JobPaths

log = logging.getLogger(__name__)


USER_ATTRIBUTES = ("gender", "age", "occupation")
ITEM_ATTRIBUTES = ("category", "sub_category", "genres", "year")


def _attribute_frame(table: pl.DataFrame, id_column: str, candidates: tuple[str, ...]) -> tuple[pl.DataFrame, list[str]]:
    """The table and the attribute hierarchy it supports; a constant "all" group when it has none."""
    hierarchy = [c for c in candidates if c in table.columns]
    if not hierarchy:
        return table.select(id_column, all=pl.lit("all")), ["all"]
    return table, hierarchy


def groups_of(cfg: JobConfig, data: JobData, write: bool = True) -> dict[str, tuple[pl.DataFrame, pl.DataFrame | None]]:
    """Per entity type: (attribute groups, collaborative groups or None), over every user and item; with
    ``write`` LightGCN's parameters are kept as the next run's warm start."""
    import router

    ds, split, rc = data.dataset, data.split, cfg.routing
    lg = router.LightGCNConfig(positive_threshold=cfg.dataset.min_positive_rating, seed=rc.seed, progress=False,
                               **rc.lightgcn)
    warm = JobPaths.of(cfg).work / "lightgcn"  # the last run's LightGCN parameters: this run's warm start
    try:
        emb = router.train_lightgcn(split.routing_interactions, lg, init=router.WarmStart.load(warm))
        if write and emb.layer0 is not None:  # a result without its parameters has no warm start to keep
            emb.layer0.save(warm)
    except ValueError as exc:  # e.g. no positive interaction at all: every entity goes to its attribute pool
        log.warning("LightGCN skipped (%s); collaborative groups unavailable", exc)
        emb = None
    data.dataset.notes.update(lightgcn_notes(emb.best_recall if emb is not None else None))
    out = {}
    for etype, table, id_col, cands, emb_of in (("user", ds.users, "user_id", USER_ATTRIBUTES, "users"),
                                                 ("item", ds.items, "item_id", ITEM_ATTRIBUTES, "items")):
        frame, hierarchy = _attribute_frame(table, id_col, cands)
        grouping = router.AttributeGrouping(hierarchy=hierarchy, max_group_size=rc.max_group_size,
                                            bucket_widths={"age": 10, "year": 10}, seed=rc.seed)
        attr = router.attribute_groups(frame, grouping, id_col)
        vectors = getattr(emb, emb_of) if emb is not None else None
        collab = None
        uses_collab = (rc.user_policy if etype == "user" else rc.item_policy) != "attribute"
        if uses_collab and vectors is not None and len(vectors) > 0:  # no unused (empty) collaborative pools
            collab = router.collaborative_groups(vectors, n_clusters=min(rc.n_clusters, len(vectors)), seed=rc.seed)
        out[etype] = (attr, collab)
    return out


def step_route(cfg: JobConfig, data: JobData, write: bool = True) -> pl.DataFrame:
    """Step 2: route every user and item; with ``write`` (not in a dry run) the routing table and the group
    memberships are saved as Parquet, and LightGCN's parameters for the next run."""
    import router

    paths = JobPaths.of(cfg)
    groups = groups_of(cfg, data, write)
    old = data.split.routing_interactions
    policies = {"user": cfg.routing.user_policy, "item": cfg.routing.item_policy}
    tables, members = [], []
    for etype, (attr, collab) in groups.items():
        counts = router.interaction_counts(old, f"{etype}_id")
        tables.append(router.route(etype, attr["entity_id"].to_list(), attr, collab, counts,
                                   policy=policies[etype], warm_threshold=cfg.routing.warm_threshold))
        members.append(router.group_memberships(etype, attr, collab))
    table = pa.concat_tables(tables)
    if write:
        router.write_routing(table, paths.routing)
        router.write_routing(pa.concat_tables(members), paths.memberships)
    frame = pl.from_arrow(table)
    data.dataset.notes.update(pool_kind_notes(frame, policies))
    counts = {f"{t}/{k}": n for t, k, n in frame.group_by("entity_type", "pool_kind").len().sort("entity_type").iter_rows()}
    log.info("routing: %s -> %s", counts, paths.routing)
    return frame


def read_routing(cfg: JobConfig) -> pl.DataFrame:
    """The routing table a previous `route` step saved."""
    import router

    path = JobPaths.of(cfg).routing
    if not path.exists():
        raise FileNotFoundError(f"{path}: no routing table; run `laser route` (or `laser run`) first")
    return pl.from_arrow(router.read_routing(path))
