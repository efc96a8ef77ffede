"""What an incremental run plans differently: it regenerates knowledge only for entities whose inputs
changed, or are new (the job's steps are the same as a full run's: pipelines/knowledge/job.py).

For every entity the job writes knowledge for, the prompt inputs' ``source_hash`` is compared with the
entity's newest row: equal -> unchanged (kept), different -> changed, none -> new. Only changed and new
entities are generated, under a fresh ``run_id`` (a killed run's id is reused on resume, so rows it wrote
count as done). Its pools are rebuilt from the latest view (yesterday's new knowledge is today's old).

The hash, not the watermark, decides: a rating edited in place keeps its timestamp, yet changes the
history. The watermark tells the ledger what arrived since the last successful run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipelines.config import JobConfig
from pipelines.knowledge.generation import GenerationRequest
from pipelines.ops.schedule import exitcodes

log = logging.getLogger(__name__)


@dataclass
class ChangePlan:
    """Which requests to generate and why."""

    todo: list[GenerationRequest] = field(default_factory=list)
    new: int = 0
    changed: int = 0
    unchanged: int = 0


def plan_changes(requests: list[GenerationRequest], latest: pl.DataFrame) -> ChangePlan:
    """Split requests by their entity's newest row in ``latest``: none (new), another source hash
    (changed; a row without a hash counts as changed), the same hash (unchanged, skipped)."""
    known = {(t, i): h for t, i, h in latest.select("entity_type", "entity_id", "source_hash").iter_rows()}
    plan = ChangePlan()
    for req in requests:
        key = (req.entity_type, req.entity_id)
        if key not in known:
            plan.new += 1
        elif known[key] is None or known[key] != req.source_hash:
            plan.changed += 1
        else:
            plan.unchanged += 1
            continue
        plan.todo.append(req)
    return plan


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
