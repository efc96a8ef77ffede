"""What a run generates: the entities whose newest knowledge is missing or was made from other inputs or
by another config (the job's steps are the same for every run: pipelines/knowledge/job.py).

For every entity the job writes knowledge for, the request's ``source_hash`` (its prompt inputs) and the
run's ``config_hash`` (model, decoder and parameters, generation rules, prompt version:
pipelines/knowledge/provenance.py) are compared with the entity's newest row: both equal -> unchanged
(kept), either different -> changed, none -> new. With ``keep_existing`` a row whose inputs are equal and
whose config differs is kept and counted (``other_config``). Rows that a killed run of the same id wrote
before it was killed are done (``resumed``), so a resumed run never decodes them again.

The hashes, not the watermark, decide: a rating edited in place keeps its timestamp, yet changes the
history. The watermark tells the ledger what arrived since the last successful run.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import polars as pl

from pipelines.config import JobConfig
from pipelines.data import Dataset, Split
from pipelines.workers import GenerationRequest
from pipelines.knowledge.requests import planned_requests, pool_routes, request_keys
from pipelines.ops.schedule import exitcodes
from pipelines.ops.schedule.latest import newest_per_entity

log = logging.getLogger(__name__)


@dataclass
class ChangePlan:
    """Which requests to generate and why; ``resumed``: entities a killed run of the same id already wrote
    (counted as new or changed like the rest, not generated again)."""

    todo: list[GenerationRequest] = field(default_factory=list)
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    resumed: int = 0
    other_config: int = 0  # changed (or, with keep_existing, kept) only because another config wrote the row
    earlier: dict[tuple[str, str], str] = field(default_factory=dict)  # newest text: each known entity's (each
    #                                                                     planned one's, planned from an index)
    why: dict[tuple[str, str], str] = field(default_factory=dict)  # each request's reason: new, changed, config,
    #                                                                 unchanged (or kept: keep_existing)


TODO_REASONS = ("new", "changed", "config")  # the reasons an entity is generated


def classify(
    keys: pl.DataFrame,
    rows: pl.DataFrame,
    config_hash: str | None,
    resuming: str | None = None,
    keep_existing: bool = False,
) -> pl.DataFrame:
    """``keys`` (entity_type, entity_id, source_hash, ...) with ``why`` (new, changed, config, unchanged or kept:
    the module docstring) and ``done`` (written by run ``resuming`` with the same hashes: not generated again),
    by joins on the store's index ``rows``: no Python object per entity."""
    ours = pl.col("run_id") == (resuming or "")
    base = newest_per_entity(rows.filter(~ours) if resuming else rows).select(
        *_KEYS, _h="source_hash", _c="config_hash", _known=pl.lit(True)
    )
    mine = rows.filter(ours) if resuming else rows.clear()
    mine = mine.select(*_KEYS, _mh="source_hash", _mc="config_hash").unique(list(_KEYS), keep="last")
    out = keys.join(base, on=list(_KEYS), how="left").join(mine, on=list(_KEYS), how="left")
    other_config = pl.col("_c").ne_missing(pl.lit(config_hash, pl.Utf8))
    why = (
        pl.when(pl.col("_known").is_null())
        .then(pl.lit("new"))
        .when(pl.col("_h").is_null() | (pl.col("_h") != pl.col("source_hash")))
        .then(pl.lit("changed"))
        .when(other_config)
        .then(pl.lit("kept" if keep_existing else "config"))
        .otherwise(pl.lit("unchanged"))
    )
    done = (
        pl.col("_mh").eq_missing(pl.col("source_hash"))
        & pl.col("_mc").eq_missing(pl.lit(config_hash, pl.Utf8))
        & pl.col("_mh").is_not_null()
    )
    return out.with_columns(why=why, done=done.fill_null(False)).drop("_h", "_c", "_known", "_mh", "_mc")


def counted(plan: ChangePlan, classified: pl.DataFrame) -> ChangePlan:
    """``plan`` with the counts of a :func:`classify` frame."""
    reasons = dict(classified.group_by("why").len().iter_rows())
    plan.new, plan.changed = reasons.get("new", 0), reasons.get("changed", 0) + reasons.get("config", 0)
    plan.unchanged = reasons.get("unchanged", 0) + reasons.get("kept", 0)
    plan.other_config = reasons.get("config", 0) + reasons.get("kept", 0)
    plan.resumed = classified.filter(pl.col("why").is_in(TODO_REASONS) & pl.col("done")).height
    return plan


def to_generate(classified: pl.DataFrame) -> pl.DataFrame:
    """The entities of a :func:`classify` frame that the run generates."""
    return classified.filter(pl.col("why").is_in(TODO_REASONS) & ~pl.col("done"))


def plan_run(
    dataset: Dataset,
    split: Split,
    routing: pl.DataFrame | None,
    pool_need: str,
    index: pl.DataFrame,
    config_hash: str | None,
    cache: Path | None = None,
    resuming: str | None = None,
    keep_existing: bool = False,
) -> ChangePlan:
    """A run's plan from frames: every entity's source hash (recomputed only where its inputs changed since the
    ``cache`` was written), classified against the store's ``index``; requests are made for the entities to
    generate alone, with their route and hash but no prompt inputs yet (``attach_payloads`` adds those a batch
    at a time, as they are decoded)."""
    classified = classify(request_keys(dataset, split, cache), index, config_hash, resuming, keep_existing)
    plan = counted(ChangePlan(), classified)
    todo = to_generate(classified)
    routes = pool_routes(pool_need, routing.join(todo, on=list(_KEYS), how="semi")) if routing is not None else {}
    plan.todo = planned_requests(todo, routes)
    return plan


def plan_changes(
    requests: list[GenerationRequest],
    rows: pl.DataFrame,
    config_hash: str | None,
    resuming: str | None = None,
    keep_existing: bool = False,
    texts: Callable[[pl.DataFrame], dict[tuple[str, str], str]] | None = None,
) -> ChangePlan:
    """Split requests by their entity's newest row in ``rows`` (module docstring; :func:`classify`); rows of
    run ``resuming`` (a killed run being resumed) with the same hashes are done. A row without a hash differs.
    ``rows`` may be the store's index (no ``knowledge``: pipelines/store/knowledge.py ``read_index``); ``texts``
    then reads the newest rows of the planned entities' texts (``knowledge_at``)."""
    keys = pl.DataFrame(
        [(*r.key, r.source_hash) for r in requests],
        orient="row",
        schema={"entity_type": pl.Utf8, "entity_id": pl.Utf8, "source_hash": pl.Utf8},
    )
    classified = classify(keys, rows, config_hash, resuming, keep_existing)
    plan = counted(ChangePlan(), classified)
    plan.why = dict(zip(zip(classified["entity_type"], classified["entity_id"]), classified["why"]))
    todo = set(to_generate(classified).select(*_KEYS).iter_rows())
    plan.todo = [r for r in requests if r.key in todo]
    plan.earlier = earlier_texts(rows, resuming, plan.todo, texts)
    return plan


_KEYS = ("entity_type", "entity_id")


def earlier_texts(
    rows: pl.DataFrame,
    resuming: str | None,
    todo: list[GenerationRequest],
    texts: Callable[[pl.DataFrame], dict[tuple[str, str], str]] | None,
) -> dict[tuple[str, str], str]:
    """Newest texts: every entity's when ``rows`` hold them, else the planned entities' through ``texts`` (their
    rows picked before the newest is found: an incremental run sorts its changed entities' rows alone)."""
    rows = rows.filter(pl.col("run_id") != resuming) if resuming else rows
    if "knowledge" in rows.columns:
        base = newest_per_entity(rows)
        return dict(zip(zip(base["entity_type"], base["entity_id"]), base["knowledge"]))
    keys = pl.DataFrame([r.key for r in todo], schema={k: pl.Utf8 for k in _KEYS}, orient="row")
    wanted = newest_per_entity(rows.join(keys, on=list(_KEYS), how="semi"))
    return texts(wanted) if texts is not None and wanted.height else {}


def users_after(interactions: pl.DataFrame, watermark: int | None) -> int:
    """Users with an interaction newer than ``watermark`` (all users when there is none)."""
    if watermark is None:
        return interactions["user_id"].n_unique()
    return interactions.filter(pl.col("timestamp") > watermark)["user_id"].n_unique()


def new_run_id(cfg: JobConfig, record_time: datetime) -> str:
    """A unique id per scheduled run: the config hash and the start time (UTC, microseconds)."""
    return f"{cfg.resolved_run_id()}-{record_time:%Y%m%dT%H%M%S.%fZ}"


def exit_code(status: str) -> int:
    """The scheduler-facing exit code of a finished run's status."""
    return exitcodes.PARTIAL if status == "partial" else exitcodes.OK


def split_first_wave(
    todo: list[GenerationRequest], pooled: set[str], share: float
) -> tuple[list[GenerationRequest], list[GenerationRequest]]:
    """(rest, first wave): of the entities whose group has no pool yet (no earlier knowledge in ``pooled``
    keys), a ``share`` of each group (at least one) decodes first, so the pools can be built from their
    texts before the rest; chosen by a hash of the id, so a resumed run picks the same ones."""
    if share <= 0:
        return todo, []
    unpooled: dict[str, list[GenerationRequest]] = {}
    for req in todo:
        if req.pool_key is not None and req.pool_key not in pooled:
            unpooled.setdefault(req.pool_key, []).append(req)
    first: set[tuple[str, str]] = set()
    for members in unpooled.values():
        members = sorted(members, key=lambda r: hashlib.sha256("/".join(r.key).encode()).digest())
        first.update(r.key for r in members[: max(1, math.ceil(share * len(members)))])
    return [r for r in todo if r.key not in first], [r for r in todo if r.key in first]
