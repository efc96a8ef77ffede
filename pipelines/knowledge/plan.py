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
from typing import Any, Callable

import polars as pl

from pipelines.config import JobConfig
from pipelines.knowledge.generation import GenerationRequest
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


def plan_changes(requests: list[GenerationRequest], rows: pl.DataFrame, config_hash: str | None,
                 resuming: str | None = None, keep_existing: bool = False,
                 texts: Callable[[pl.DataFrame], dict[tuple[str, str], str]] | None = None) -> ChangePlan:
    """Split requests by their entity's newest row in ``rows`` (module docstring); rows of run ``resuming``
    (a killed run being resumed) with the same hashes are done. A row without a hash differs. ``rows`` may
    be the store's index (no ``knowledge``: pipelines/knowledge_store.py ``read_index``); ``texts`` then
    reads the newest rows of the planned entities' texts (``knowledge_at``)."""
    mine = rows.filter(pl.col("run_id") == resuming) if resuming else rows.clear()
    done = {(t, i): (h, c) for t, i, h, c in mine.select(*_KEYS, "source_hash", "config_hash").iter_rows()}
    base = newest_per_entity(rows.filter(pl.col("run_id") != resuming) if resuming else rows)
    known = {(t, i): (h, c) for t, i, h, c in base.select(*_KEYS, "source_hash", "config_hash").iter_rows()}
    plan = ChangePlan()
    for req in requests:
        key, want = req.key, (req.source_hash, config_hash)
        plan.why[key] = why = _reason(known.get(key), req.source_hash, config_hash, keep_existing)
        plan.other_config += why in ("config", "kept")
        if why in ("unchanged", "kept"):
            plan.unchanged += 1
            continue
        if why == "new":
            plan.new += 1
        else:
            plan.changed += 1
        if done.get(key) == want:
            plan.resumed += 1
            continue
        plan.todo.append(req)
    plan.earlier = _earlier_texts(base, plan.todo, texts)
    return plan


_KEYS = ("entity_type", "entity_id")


def _earlier_texts(base: pl.DataFrame, todo: list[GenerationRequest],
                   texts: Callable[[pl.DataFrame], dict[tuple[str, str], str]] | None) -> dict[tuple[str, str], str]:
    """Newest texts: every entity's when ``base`` holds them, else the planned entities' through ``texts``."""
    if "knowledge" in base.columns:
        return dict(zip(zip(base["entity_type"], base["entity_id"]), base["knowledge"]))
    keys = pl.DataFrame([r.key for r in todo], schema={k: pl.Utf8 for k in _KEYS}, orient="row")
    wanted = base.join(keys, on=list(_KEYS), how="semi")
    return texts(wanted) if texts is not None and wanted.height else {}


def _reason(newest: tuple | None, source_hash: str | None, config_hash: str | None, keep_existing: bool) -> str:
    """Why an entity is (or is not) generated, from its newest row's (source_hash, config_hash, ...)."""
    if newest is None:
        return "new"
    if newest[0] is None or newest[0] != source_hash:
        return "changed"
    if newest[1] != config_hash:
        return "kept" if keep_existing else "config"
    return "unchanged"


def users_after(interactions: pl.DataFrame, watermark: int | None) -> int:
    """Users with an interaction newer than ``watermark`` (all users when there is none)."""
    if watermark is None:
        return interactions["user_id"].n_unique()
    return interactions.filter(pl.col("timestamp") > watermark)["user_id"].n_unique()


def new_run_id(cfg: JobConfig, record_time: Any) -> str:
    """A unique id per scheduled run: the config hash and the start time (UTC, microseconds)."""
    return f"{cfg.resolved_run_id()}-{record_time:%Y%m%dT%H%M%S.%fZ}"


def exit_code(status: str) -> int:
    """The scheduler-facing exit code of a finished run's status."""
    return exitcodes.PARTIAL if status == "partial" else exitcodes.OK


def split_first_wave(todo: list[GenerationRequest], pooled: set[str],
                     share: float) -> tuple[list[GenerationRequest], list[GenerationRequest]]:
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
        first.update(r.key for r in members[:max(1, math.ceil(share * len(members)))])
    return [r for r in todo if r.key not in first], [r for r in todo if r.key in first]
