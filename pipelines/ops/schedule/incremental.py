"""Scheduled incremental runs: regenerate knowledge only for entities whose inputs changed, or are new.

A run (under the output's :class:`RunLock`, recorded in the :class:`RunLedger`):

1. loads the interactions; the watermark is their newest timestamp;
2. old knowledge where missing, routing, as in the one-shot job;
3. pools rebuilt from the latest view (old knowledge and every earlier run's new knowledge: yesterday's
   new knowledge is today's old knowledge);
4. for every entity the job writes knowledge for, the prompt inputs' ``source_hash`` is compared with
   the entity's newest row: equal -> unchanged (kept), different -> changed, none -> new. Only changed
   and new entities are generated, under a fresh ``run_id`` (a killed run's id is reused on resume, so
   rows it wrote count as done);
5. the latest view is rewritten, the ledger row closed.

The hash, not the watermark, decides: a rating edited in place keeps its timestamp, yet changes the
history. The watermark tells the ledger what arrived since the last successful run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipelines.config import JobConfig
from pipelines.knowledge.generation import GenerationReport, GenerationRequest, WorkerGroup
from pipelines.knowledge.store import KnowledgeWriter, open_store, read_knowledge
from pipelines.ops.schedule import exitcodes
from pipelines.ops.schedule.latest import LATEST_FILE, latest_view, newest_per_entity, write_latest
from pipelines.ops.schedule.ledger import RunLedger, RunRecord
from pipelines.lock import output_lock
from pipelines.knowledge.strategy import new_knowledge_decoder

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


def _generate_changed(cfg: JobConfig, plan: ChangePlan, run_id: str, domain: str, workers: WorkerGroup) -> GenerationReport:
    from pipelines.knowledge.job import JobPaths, new_knowledge_task

    if not plan.todo:
        return GenerationReport()
    paths = JobPaths.of(cfg)
    task = new_knowledge_task(cfg, run_id, domain, paths.pools)
    with KnowledgeWriter(paths.knowledge, shard_rows=cfg.output.shard_rows, run_id=run_id) as writer:
        return workers.run(plan.todo, task, writer, slots=cfg.execution.batch_size, desc="changed knowledge")


def _steps(cfg: JobConfig, rec: RunRecord, ledger: RunLedger) -> None:
    """The run's work; fills ``rec`` as it goes."""
    from pipelines.knowledge.job import (JobPaths, check_job_decoder, load_job_data, new_requests, step_build_pools,
                               step_old_knowledge, step_route, worker_group)

    paths = JobPaths.of(cfg)
    for store in (paths.knowledge, paths.old_knowledge):  # corrupt shards out, so their entities are redone
        if store.exists():
            open_store(store)
    data = load_job_data(cfg)
    inter = data.dataset.interactions
    rec.watermark = int(inter["timestamp"].max()) if inter.height else None
    rec.users_after_watermark = users_after(inter, rec.previous_watermark)
    check_job_decoder(cfg)
    with worker_group(cfg) as workers:
        old = step_old_knowledge(cfg, data, workers)
        rec.old_generated, rec.old_failed = old.done, old.failed
        routing = step_route(cfg, data)
        step_build_pools(cfg, latest_view(paths.knowledge, paths.old_knowledge).to_arrow())
        plan = plan_changes(new_requests(data, routing, new_knowledge_decoder(cfg).name),
                            read_knowledge(paths.knowledge), rec.run_id)
        rec.entities_new, rec.entities_changed, rec.entities_unchanged = plan.new, plan.changed, plan.unchanged
        log.info("run %s: %d new, %d changed, %d unchanged entities; %d users with interactions after the "
                 "watermark", rec.run_id, plan.new, plan.changed, plan.unchanged, rec.users_after_watermark)
        ledger.save(rec)
        new = _generate_changed(cfg, plan, rec.run_id, data.dataset.domain, workers)
        rec.generated, rec.failed = plan.resumed + new.done, new.failed  # a resumed run counts its whole work
    write_latest(paths.root / LATEST_FILE, latest_view(paths.knowledge, paths.old_knowledge))


def run_incremental(cfg: JobConfig) -> RunRecord:
    """One scheduled run over ``output.path`` (see the module doc). Raises :class:`LockHeld` when another
    run holds the output; the returned record's ``status`` is ``succeeded`` or ``partial``."""
    from pipelines.knowledge.job import JobPaths

    from pipelines.knowledge.store import utc_now

    root = JobPaths.of(cfg).root
    root.mkdir(parents=True, exist_ok=True)
    config_hash = cfg.resolved_run_id()
    with output_lock(root, run_id=config_hash):
        ledger = RunLedger(root)
        previous = ledger.last_succeeded()
        resumed = ledger.unfinished(config_hash)
        started = utc_now()
        run_id = resumed.run_id if resumed else new_run_id(cfg, started)
        if resumed:
            log.warning("resuming run %s, which did not finish (killed?)", run_id)
        rec = RunRecord(run_id=run_id, decoder=new_knowledge_decoder(cfg).name, config_hash=config_hash,
                        started=resumed.started if resumed else started,
                        previous_watermark=previous.watermark if previous else None)
        ledger.save(rec)
        try:
            _steps(cfg, rec, ledger)
        except BaseException as exc:
            rec.status, rec.finished, rec.error = "failed", utc_now(), f"{type(exc).__name__}: {exc}"[:2000]
            ledger.save(rec)
            raise
        rec.status = "partial" if rec.failed or rec.old_failed else "succeeded"
        rec.finished = utc_now()
        ledger.save(rec)
        return rec


def exit_code(rec: RunRecord) -> int:
    """The scheduler-facing exit code of a finished run."""
    return exitcodes.PARTIAL if rec.status == "partial" else exitcodes.OK
