"""The knowledge job: one list of steps that every run takes (`laser run`, `--incremental`, the scheduled
entry point and `laser submit`, which runs `laser run` on the cluster).

Under the output's lock, recorded in the run ledger:

  load            the dataset and its split (``split.mode``: latest histories, or the paper's old/new);
  old knowledge   paper mode only: the target's greedy text for old histories and existing items;
  route           every user and item to a pool group (collaborative or attribute);
  plan            which entities get knowledge: new ones, and those whose newest row was made from other
                  inputs or by another config (pipelines/knowledge/plan.py); a killed run resumes;
  pools           one retrieval pool per group from earlier knowledge: the latest view (whichever run
                  wrote it: yesterday's new knowledge is today's old), or old knowledge (paper, full run);
  new knowledge   the configured decoder, rows streamed into the knowledge store as they finish. Each
                  entity drafts from its own earlier text first, then its group's pool. Groups with no
                  earlier knowledge at all (a first run) draft from pools that grow in each worker as it
                  writes their texts (``routing.online_pools``; or in two waves, ``routing.first_wave``);
  latest view     one row per entity, the newest run's, for CTR training and the feature store.

Every run, one-shot or scheduled, takes these steps; they differ in the run id and in the ledger's
reading of the exit. Each step's checks run before any step does (:func:`check_job`), so a bad config
fails before hours of work.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import polars as pl
import pyarrow as pa

from laser.decoders import DecoderChoice
from pipelines.config import JobConfig
from pipelines.knowledge.accounting import skipped_entities
from pipelines.knowledge.decoders import check_job_decoders, job_engine, new_knowledge_decoder, old_knowledge_decoder
from pipelines.knowledge.generation import GenerationReport, GenerationWorker, record_result
from pipelines.knowledge.records import DecodeTask
from pipelines.knowledge.inputs import JobData, load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.prompts.template import load_template
from pipelines.knowledge.requests import (
    SOURCE_CACHE,
    attach_payloads,
    drop_payloads,
    new_requests,
    old_requests,
    pending,
    pool_routes,
)
from pipelines.knowledge.pool_build import step_build_pools
from pipelines.knowledge.routing import read_routing, step_route
from pipelines.store.knowledge import KnowledgeRow, KnowledgeWriter, knowledge_at, read_index, read_knowledge
from pipelines.store.shards import open_shards, utc_now
from pipelines.knowledge.summary import JobSummary
from pipelines.knowledge.time_account import TimeAccount
from pipelines.knowledge.validation import load_inputs
from pipelines.store.lock import output_lock
from pipelines.knowledge.plan import earlier_texts, new_run_id, plan_run, split_first_wave, users_after
from pipelines.knowledge.provenance import generation_hash
from pipelines.quality import catalogue_brands
from pipelines.ops.schedule.failures import drop_given_up
from pipelines.ops.schedule.latest import delta_target, latest_view, update_latest
from pipelines.ops.schedule.ledger import RunLedger, RunRecord
from pipelines.workers import GenerationRequest, LocalGroup, WorkerGroup
from pipelines.store.location import Location
from pipelines.workers.layout import compile_model, job_actors

log = logging.getLogger(__name__)

# the job's generation workers: actors on Ray, or one worker in this process (tools and tests)
Workers = WorkerGroup[DecodeTask, KnowledgeRow] | LocalGroup[DecodeTask, KnowledgeRow]


@dataclass
class JobRun:
    """One run's state as the steps fill it."""

    cfg: JobConfig
    paths: JobPaths
    incremental: bool
    record: RunRecord
    decoder: DecoderChoice
    workers: Workers
    data: JobData | None = None
    routing: pl.DataFrame | None = None
    keep_existing: bool = False  # keep rows another config wrote (inputs unchanged) instead of regenerating
    resuming: bool = False  # a killed run of this config, resumed under its id
    task: DecodeTask | None = None  # the new-knowledge pass (its config hash decides what is stale)
    todo: list[GenerationRequest] = field(default_factory=list)
    first_wave: list[GenerationRequest] = field(default_factory=list)  # decoded before the pools are rebuilt
    resumed: int = 0  # entities this run (resumed after a kill) had already written
    other_config: int = 0  # entities whose newest row another config wrote
    old: GenerationReport = field(default_factory=GenerationReport)
    new: GenerationReport = field(default_factory=GenerationReport)
    previous: RunRecord | None = None  # the output's last succeeded run
    account: TimeAccount = field(default_factory=TimeAccount)  # where the run's wall time went

    @property
    def inputs(self) -> JobData:
        """The loaded inputs (the load step's; a step that reads them runs after it)."""
        if self.data is None:
            raise RuntimeError("the job's inputs are read before its load step ran")
        return self.data

    @property
    def new_pass(self) -> DecodeTask:
        """The new-knowledge pass (the plan step's)."""
        if self.task is None:
            raise RuntimeError("the new-knowledge pass is read before the plan step made it")
        return self.task


# ---- the steps ---------------------------------------------------------------------------------------


def _load(job: JobRun) -> None:
    if job.data is None:
        job.data = load_inputs(load_job_data, job.cfg)
    inter = job.inputs.dataset.interactions
    job.record.watermark = int(inter.select(pl.col("timestamp").max()).item()) if inter.height else None
    job.record.users_after_watermark = users_after(inter, job.record.previous_watermark)
    likely = likely_work(job)
    if likely:  # the engines start while the driver routes and plans
        _start_workers(job, likely)


def likely_work(job: JobRun) -> int:
    """Entities the run will likely generate, judged from the ledger before the plan (0: cannot tell; the
    plan decides): the whole catalogue on a first run, a resumed run or a changed config; else the users
    whose interactions are newer than the last run's watermark."""
    rec, dataset = job.record, job.inputs.dataset
    if job.previous is None or job.resuming or job.previous.config_hash != rec.config_hash:
        return dataset.users.height + dataset.items.height
    return rec.users_after_watermark


def _start_workers(job: JobRun, entities: int) -> None:
    """Have the actors start their engines for a run of about ``entities`` (which decides whether vLLM
    compiles the model) without waiting: the driver goes on with its own steps meanwhile."""
    workers = job.workers
    if workers.started or entities <= 0:
        return
    if isinstance(workers, WorkerGroup):
        workers.spec = replace(workers.spec, compile=compile_model(job.cfg.execution, entities))
    with job.account.phase("startup"):  # Ray's start (and a bundled model's first unpacking) wait here
        workers.start(job.cfg.execution.batch_size, entities)


def _old_knowledge(job: JobRun) -> None:
    if job.inputs.split.mode != "paper":  # earlier knowledge is what earlier runs wrote
        return
    job.old = step_old_knowledge(job.cfg, job.inputs, job.workers, job.record.seq)
    job.record.old_generated, job.record.old_failed = job.old.done, job.old.failed
    job.account.generation(job.old.engine_time(), phase="old knowledge")


def _route(job: JobRun) -> None:
    job.routing = step_route(job.cfg, job.inputs, incremental=job.incremental)


def _earlier_knowledge(job: JobRun) -> pa.Table:
    """Every entity's newest knowledge (the latest view), or old knowledge alone (paper mode, full run)."""
    paths = job.paths
    if job.inputs.split.mode == "paper" and not job.incremental:
        return read_knowledge(paths.old_knowledge).select("entity_type", "entity_id", "knowledge").to_arrow()
    return (
        latest_view(paths.knowledge, paths.old_knowledge, ["entity_type", "entity_id", "knowledge"])
        .drop("store")
        .to_arrow()
    )


def _plan(job: JobRun) -> None:
    rec, data = job.record, job.inputs
    brands = catalogue_brands(data.dataset.items)
    job.task = knowledge_task(job.cfg, job.decoder, rec.run_id, data.dataset.domain, job.paths.pools, brands=brands)
    store = job.paths.knowledge  # the index, no texts; then the planned entities' earlier texts alone
    index, resuming = read_index(store), rec.run_id if job.resuming else None
    plan = plan_run(
        data.dataset,
        data.split,
        job.routing,
        job.decoder.cls.pool,
        index,
        job.new_pass.config_hash,
        job.paths.work / SOURCE_CACHE,
        resuming,
        job.keep_existing,
    )  # hashes: changed inputs only
    job.todo = plan.todo
    job.resumed = plan.resumed
    job.todo, rec.given_up = drop_given_up(
        job.todo, job.paths.knowledge, job.cfg.generation.give_up_after, job.new_pass.config_hash, rec.run_id
    )
    earlier = earlier_texts(index, resuming, job.todo, lambda rows: knowledge_at(store, rows))
    for req in job.todo:  # its own earlier text is an entity's likeliest draft
        req.earlier = earlier.get(req.key)
    rec.entities_new, rec.entities_changed, rec.entities_unchanged = plan.new, plan.changed, plan.unchanged
    log.info(
        "run %s: %d new, %d changed, %d unchanged entities",
        rec.run_id,
        rec.entities_new,
        rec.entities_changed,
        rec.entities_unchanged,
    )
    if plan.other_config:
        verb = "kept (--keep-existing)" if job.keep_existing else "regenerated"
        log.warning(
            "%d entities have rows another config wrote (model, decoder, generation rules or prompt "
            "version differ): %s",
            plan.other_config,
            verb,
        )
    job.other_config = plan.other_config
    _start_workers(job, len(job.todo))  # the run's size is known now; a run with nothing to do starts none


def _pools(job: JobRun) -> None:
    if job.decoder.cls.pool == "none":  # a decoder that drafts from no pool: none to build
        return
    sizes = step_build_pools(job.cfg, _earlier_knowledge(job), pool_need=job.decoder.cls.pool)
    if job.decoder.cls.pool != "routed":
        return
    if job.cfg.routing.online_pools:  # groups without a pool get one growing in the workers as they write
        job.task = replace(job.new_pass, online_pools=True)
    else:
        job.todo, job.first_wave = split_first_wave(job.todo, set(sizes), job.cfg.routing.first_wave)


def _new_knowledge(job: JobRun) -> None:
    task = job.new_pass
    check_pool_store(job.decoder, job.paths)
    job.new = GenerationReport()
    rebuilt = job.paths.work / "pools-second-wave"  # a new store: the actors' pool caches know the first
    if job.first_wave:  # groups with no earlier knowledge: a first share drafts alone, then pools from it
        log.info(
            "first wave: %d entities of groups with no earlier knowledge; the pools are rebuilt from their "
            "texts before the other %d",
            len(job.first_wave),
            len(job.todo),
        )
        write_knowledge(
            job.cfg,
            job.first_wave,
            task,
            job.paths.knowledge,
            "new knowledge, first wave",
            job.workers,
            job.record.seq,
            job.new,
            _payloads(job),
        )
        with job.account.phase("pools"):
            step_build_pools(job.cfg, _earlier_knowledge(job), rebuilt, pool_need=job.decoder.cls.pool)
        task = replace(task, pool_store=str(rebuilt))
    write_knowledge(
        job.cfg,
        job.todo,
        task,
        job.paths.knowledge,
        "new knowledge",
        job.workers,
        job.record.seq,
        job.new,
        _payloads(job),
    )
    if job.first_wave:  # the job's pool store is the one built from every text (laser build-pools' place)
        shutil.rmtree(job.paths.pools, ignore_errors=True)
        rebuilt.rename(job.paths.pools)
    # a resumed run counts its whole work: rows it wrote before it was killed too
    job.record.generated, job.record.failed = job.resumed + job.new.done, job.new.failed
    job.account.generation(job.new.engine_time())


def _payloads(job: JobRun) -> Callable[[list[GenerationRequest]], None]:
    """How a batch of the run's planned requests gets its prompt inputs (histories, item rows)."""
    return lambda batch: attach_payloads(job.inputs.dataset, job.inputs.split, batch)


def _latest(job: JobRun) -> None:
    paths = job.paths
    update_latest(paths.root, paths.knowledge, paths.old_knowledge, run_id=job.record.run_id)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[JobRun], None]
    phase: str | None  # the time account's phase it is timed as; None: it times its own parts


STEPS = (
    Step("load", _load, "load"),
    Step("old knowledge", _old_knowledge, "old knowledge"),
    Step("route", _route, "route"),
    Step("plan", _plan, "plan"),
    Step("pools", _pools, "pools"),
    Step("new knowledge", _new_knowledge, None),
    Step("latest view", _latest, "latest view"),
)


# ---- running them ----------------------------------------------------------------------------------


def check_job(cfg: JobConfig) -> DecoderChoice:
    """The checks of every step, before any work: decoders and their parameters, the output location (one
    the stores and the latest view's Delta table can be written to).
    Returns the new-knowledge decoder."""
    decoder = check_job_decoders(cfg)
    delta_target(JobPaths.of(cfg).root)  # an output URI whose filesystem is not installed, or not Delta's
    return decoder


def run_job(cfg: JobConfig, incremental: bool = False, keep_existing: bool = False) -> JobSummary:
    """Every step under the output's lock, recorded in the run ledger; returns (and writes to
    ``summary.json``) the closing summary. ``keep_existing`` keeps rows another config wrote (inputs
    unchanged) instead of regenerating them. Raises ``LockHeld`` when another run holds the output."""
    account = TimeAccount()
    decoder = check_job(cfg)
    # a full run creates nothing before its inputs are known good; a scheduled run loads them under its
    # lock, so that its ledger row says why it stopped
    data = None
    if not incremental:
        with account.phase("load"):
            data = load_inputs(load_job_data, cfg)
    paths = JobPaths.of(cfg)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.work.mkdir(parents=True, exist_ok=True)
    with output_lock(paths.root, run_id=cfg.resolved_run_id()):  # one writer per output (pipelines/store/lock.py)
        for store in (paths.knowledge, paths.old_knowledge):  # corrupt shards out, so their entities are redone
            if store.exists():
                open_shards(store)
        ledger = RunLedger(paths.root)
        previous = ledger.last_succeeded()
        record, resuming = _open_record(cfg, ledger, incremental, decoder.name)
        with worker_group(cfg) as workers:  # started by the load or plan step, once the run's size is known
            job = JobRun(
                cfg,
                paths,
                incremental,
                record,
                decoder,
                workers,
                data=data,
                keep_existing=keep_existing,
                resuming=resuming,
                previous=previous,
                account=account,
            )
            _run_steps(job, ledger, record, account)
            account.engine_ready_s = max(workers.ready_s, default=0.0)
        record.status = "partial" if record.failed or record.old_failed else "succeeded"
        record.finished = utc_now()
        ledger.save(record)
    return _close_run(job, record, account)


def _run_steps(job: JobRun, ledger: RunLedger, record: RunRecord, account: TimeAccount) -> None:
    """The steps in order, the ledger row saved after each; a step that raises marks the run failed (ledger
    row and metrics) and the error goes on."""
    try:
        for step in STEPS:
            log.info("step: %s", step.name)
            with account.phase(step.phase) if step.phase else nullcontext():
                step.run(job)
            ledger.save(record)  # what the run has done so far, should it be killed
    except BaseException as exc:
        record.status, record.finished, record.error = (
            "failed",
            utc_now(),
            f"{type(exc).__name__}: {exc}"[:2000],
        )
        ledger.save(record)
        _push_metrics(
            job.cfg, job.paths, {"record": asdict(record), "run_id": record.run_id, "time": account.to_json()}
        )
        raise


def _close_run(job: JobRun, record: RunRecord, account: TimeAccount) -> JobSummary:
    """The closing summary of a finished run, written to ``summary.json`` and pushed as metrics."""
    cfg, paths = job.cfg, job.paths
    summary = JobSummary.of(cfg, job.old, job.new, paths.knowledge, 0.0)
    summary.run_id, summary.mode, summary.record = record.run_id, "incremental" if job.incremental else "full", record
    summary.other_config, summary.first_wave = job.other_config, len(job.first_wave)
    summary.skipped, summary.input_notes = (
        skipped_entities(job.inputs.dataset, job.inputs.split),
        dict(job.inputs.dataset.notes),
    )
    summary.time = account.close()
    summary.wall_s = account.wall_s
    figures = summary.to_json()
    paths.summary.write_text(json.dumps(figures, indent=1, default=str))
    _push_metrics(cfg, paths, figures)
    return summary


def _push_metrics(cfg: JobConfig, paths: JobPaths, figures: dict[str, object]) -> None:
    """The run's figures to the Pushgateway, when one is configured (pipelines/ops/pushgateway.py)."""
    from pipelines.ops.pushgateway import gateway, push_run

    push_run(figures, gateway(cfg.metrics.pushgateway), cfg.metrics.job, str(paths.root))


def _open_record(cfg: JobConfig, ledger: RunLedger, incremental: bool, decoder: str) -> tuple[RunRecord, bool]:
    """The ledger row of this run (a killed run of the same config is resumed under its own id and
    sequence number) and whether it resumes one."""
    config_hash = cfg.resolved_run_id()
    previous, resumed, started = ledger.last_succeeded(), ledger.unfinished(config_hash), utc_now()
    if resumed:
        log.warning("resuming run %s, which did not finish (killed?)", resumed.run_id)
        run_id = resumed.run_id
    else:
        run_id = new_run_id(cfg, started) if incremental else config_hash
    record = RunRecord(
        run_id=run_id,
        decoder=decoder,
        config_hash=config_hash,
        started=resumed.started if resumed else started,
        previous_watermark=previous.watermark if previous else None,
        seq=resumed.seq if resumed and resumed.seq is not None else ledger.next_seq(),
    )
    ledger.save(record)
    return record, resumed is not None


# ---- steps alone (`laser generate`, tools) and their parts ------------------------------------------


def worker_group(cfg: JobConfig, entities: int | None = None) -> WorkerGroup[DecodeTask, KnowledgeRow]:
    """The job's generation actors (one model load each, shared by every pass of the job), each driving the
    engine the job resolves (:func:`~pipelines.knowledge.decoders.job_engine`); ``entities``: the run's
    users and items, when known."""
    engine = job_engine(cfg)
    spec, num_workers = job_actors(cfg, entities, engine=engine)
    spec = replace(spec, pool_roots=(str(JobPaths.of(cfg).work),))  # the job's pool stores lie under its work dir
    log.info("engine: %s (execution.engine: %s)", engine, cfg.execution.engine)
    return WorkerGroup(GenerationWorker, spec, num_workers, cfg.execution.address, cfg.execution.progress_timeout_s)


def knowledge_task(
    cfg: JobConfig,
    decoder: DecoderChoice,
    run_id: str,
    domain: str,
    pool_store: Path | str | None,
    greedy: bool = False,
    brands: tuple[str, ...] = (),
) -> DecodeTask:
    """A pass's decode task, with the hash of what decides its texts (pipelines/knowledge/provenance.py);
    ``greedy`` (old knowledge) ignores the job's sampling settings; ``brands``: the catalogue's, which item
    grounding counts (:func:`pipelines.quality.catalogue_brands`)."""
    max_new = (
        (cfg.old_knowledge.max_new_tokens or cfg.generation.max_new_tokens) if greedy else cfg.generation.max_new_tokens
    )
    prompts = load_template(cfg.prompts.template, domain, cfg.prompts.system)  # prompts.template wins over domain
    task = DecodeTask(
        decoder=decoder.name,
        decoder_params=decoder.params,
        max_new_tokens=max_new,
        max_prompt_tokens=cfg.generation.max_prompt_tokens,
        domain=prompts.name if prompts.shipped else domain,
        prompt_version=prompts.version,
        run_id=run_id,
        pool_store=str(pool_store) if pool_store else None,
        pool_cache_size=cfg.execution.pool_cache_size,
        pool_max_size=cfg.routing.max_pool_size,
        degenerate=cfg.generation.degenerate,
        sampling=None if greedy else cfg.generation.sampling(),
        rules=cfg.generation.rules(),
        retry_rules=cfg.generation.retry_rules(),
        ban_unsupported_genres=cfg.generation.ban_unsupported_genres,
        prompts=prompts,
        brands=brands,
    )
    task.config_hash = generation_hash(cfg.model.name, cfg.model.dtype, asdict(task))
    return task


REQUEST_BATCH = 50_000  # requests whose prompt inputs the driver holds at once (payloads attached per batch)


def write_knowledge(
    cfg: JobConfig,
    requests: list[GenerationRequest],
    task: DecodeTask,
    store: Path | Location,
    desc: str,
    workers: Workers | None,
    run_seq: int | None = None,
    report: GenerationReport | None = None,
    payloads: Callable[[list[GenerationRequest]], None] | None = None,
) -> GenerationReport:
    """Generate ``requests`` and stream their rows into ``store`` as they finish (stamped with the run's
    sequence number), counted into ``report`` (a new one by default). With ``payloads`` (requests planned
    without their prompt inputs) the requests go in batches of :data:`REQUEST_BATCH` in pool order, each filled
    by ``payloads`` before it is sent and emptied after."""
    report = report if report is not None else GenerationReport()
    if not requests:
        return report
    start = time.perf_counter()
    size = REQUEST_BATCH if payloads is not None else len(requests)
    ordered = sorted(requests, key=lambda r: (r.pool_key or "", r.key)) if payloads is not None else requests
    batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    with (
        KnowledgeWriter(store, shard_rows=cfg.output.shard_rows, run_id=task.run_id, run_seq=run_seq) as writer,
        nullcontext(workers) if workers is not None else worker_group(cfg) as group,
    ):
        writer.note_inputs({r.key: r.source_hash for r in requests}, task.config_hash)  # kept with failures
        waited = group.startup_s
        for n, batch in enumerate(batches, start=1):
            if payloads is not None:
                payloads(batch)
            label = desc if len(batches) == 1 else f"{desc} ({n}/{len(batches)})"
            for result in group.stream(batch, task, slots=cfg.execution.batch_size, desc=label):
                t0 = time.perf_counter()
                record_result(result, writer, report)
                report.write_s += time.perf_counter() - t0
            if payloads is not None:
                drop_payloads(batch)
        report.startup_s += group.startup_s - waited
        report.actors = group.working()
        t0 = time.perf_counter()
        writer.flush()
    report.write_s += time.perf_counter() - t0  # the flush and the commit
    report.wall_s += time.perf_counter() - start
    return report


def check_pool_store(decoder: DecoderChoice, paths: JobPaths) -> None:
    """A decoder that drafts from pools needs the pool store the pools step writes."""
    if decoder.cls.pool != "none" and not (paths.pools / "manifest.json").exists():
        raise FileNotFoundError(f"{paths.pools}: no pool store; run `laser build-pools` (or `laser run`) first")


def step_old_knowledge(
    cfg: JobConfig, data: JobData, workers: Workers | None = None, run_seq: int | None = None
) -> GenerationReport:
    """Old knowledge for every user with an old history and every existing item, where missing."""
    paths = JobPaths.of(cfg)
    todo = pending(old_requests(data.dataset, data.split), paths.old_knowledge)
    if not cfg.old_knowledge.generate_missing:
        log.info("old knowledge: generation disabled; %d entities lack old knowledge", len(todo))
        return GenerationReport()
    task = knowledge_task(
        cfg,
        old_knowledge_decoder(cfg),
        f"{cfg.resolved_run_id()}-old",
        data.dataset.domain,
        None,
        greedy=True,
        brands=catalogue_brands(data.dataset.items),
    )
    return write_knowledge(cfg, todo, task, paths.old_knowledge, "old knowledge", workers, run_seq)


def step_generate(
    cfg: JobConfig, data: JobData, routing: pl.DataFrame, workers: Workers | None = None
) -> GenerationReport:
    """New knowledge alone (`laser generate`) for the entities not yet written, after route and pools."""
    paths = JobPaths.of(cfg)
    decoder = new_knowledge_decoder(cfg)
    check_pool_store(decoder, paths)
    brands = catalogue_brands(data.dataset.items)
    task = knowledge_task(cfg, decoder, cfg.resolved_run_id(), data.dataset.domain, paths.pools, brands=brands)
    todo = pending(new_requests(data.dataset, data.split, pool_routes(decoder.cls.pool, routing)), paths.knowledge)
    return write_knowledge(cfg, todo, task, paths.knowledge, "new knowledge", workers)


__all__ = [
    "STEPS",
    "JobRun",
    "check_job",
    "read_routing",
    "run_job",
    "step_build_pools",
    "step_generate",
    "step_old_knowledge",
    "step_route",
    "worker_group",
]
