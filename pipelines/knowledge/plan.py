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


def plan_changes(requests: list[GenerationRequest], rows: pl.DataFrame, run_id: str | None = None) -> ChangePlan:
    """Split requests by their entity's newest row in ``rows`` written before run ``run_id``: none (new),
    another source hash (changed; a row without a hash counts as changed), the same hash (unchanged,
    skipped). Rows run ``run_id`` itself wrote before it was killed (same hash) are done: its counts
    cover the whole run, resumed or not."""
    mine = rows.filter(pl.col("run_id") == run_id) if run_id else rows.clear()
    done = {(t, i): h for t, i, h in mine.select("entity_type", "entity_id", "source_hash").iter_rows()}
    base = newest_per_entity(rows.filter(pl.col("run_id") != run_id) if run_id else rows)
    known = {(t, i): h for t, i, h in base.select("entity_type", "entity_id", "source_hash").iter_rows()}
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
        if key in done and done[key] == req.source_hash:
            plan.resumed += 1
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
