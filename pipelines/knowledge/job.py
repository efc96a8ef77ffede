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
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from functools import partial
from typing import Callable, Iterator

import polars as pl
import pyarrow as pa

from laser.decoder_card import DecoderChoice
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
class RunContext:
    """What every step of one run reads besides its config: paths, decoder, workers and time account, and
    the run's ledger row, into which the steps count what they did (it is saved after each)."""

    paths: JobPaths
    incremental: bool
    record: RunRecord
    decoder: DecoderChoice
    workers: Workers
    account: TimeAccount
    keep_existing: bool = False  # keep rows another config wrote (inputs unchanged) instead of regenerating
    resuming: bool = False  # a killed run of this config, resumed under its id
    previous: RunRecord | None = None  # the output's last succeeded run


@dataclass(frozen=True)
class Planned:
    """The plan step's output: the new-knowledge pass (its config hash decides what is stale) and the
    entities it regenerates."""

    task: DecodeTask
    todo: list[GenerationRequest]
    resumed: int  # entities this run (resumed after a kill) had already written
    other_config: int  # entities whose newest row another config wrote


@dataclass(frozen=True)
class Work:
    """The pools step's output: the pass as the pools left it, and its entities in the order they decode
    (``first_wave``: decoded before the pools are rebuilt from their texts)."""

    task: DecodeTask
    todo: list[GenerationRequest]
    first_wave: list[GenerationRequest] = field(default_factory=list)


@dataclass(frozen=True)
class Ran:
    """What a run made, for its closing summary."""

    data: JobData
    old: GenerationReport
    new: GenerationReport
    other_config: int
    first_wave: int


# ---- the steps ---------------------------------------------------------------------------------------


def _load(cfg: JobConfig, run: RunContext, data: JobData | None) -> JobData:
    """The inputs (loaded here unless given); the engines start now when the ledger tells the run's size."""
    data = data if data is not None else load_inputs(load_job_data, cfg)
    inter = data.dataset.interactions
    run.record.watermark = int(inter.select(pl.col("timestamp").max()).item()) if inter.height else None
    run.record.users_after_watermark = users_after(inter, run.record.previous_watermark)
    likely = likely_work(run, data)
    if likely:  # the engines start while the driver routes and plans
        _start_workers(cfg, run, likely)
    return data


def likely_work(run: RunContext, data: JobData) -> int:
    """Entities the run will likely generate, judged from the ledger before the plan (0: cannot tell; the
    plan decides): the whole catalogue on a first run, a resumed run or a changed config; else the users
    whose interactions are newer than the last run's watermark."""
    rec, dataset = run.record, data.dataset
    if run.previous is None or run.resuming or run.previous.config_hash != rec.config_hash:
        return dataset.users.height + dataset.items.height
    return rec.users_after_watermark


def _start_workers(cfg: JobConfig, run: RunContext, entities: int) -> None:
    """Have the actors start their engines for a run of about ``entities`` (which decides whether vLLM
    compiles the model) without waiting: the driver goes on with its own steps meanwhile."""
    workers = run.workers
    if workers.started or entities <= 0:
        return
    if isinstance(workers, WorkerGroup):
        workers.spec = replace(workers.spec, compile=compile_model(cfg.execution, entities))
    with run.account.phase("startup"):  # Ray's start (and a bundled model's first unpacking) wait here
        workers.start(cfg.execution.batch_size, entities)


def _old_knowledge(cfg: JobConfig, run: RunContext, data: JobData) -> GenerationReport:
    if data.split.mode != "paper":  # earlier knowledge is what earlier runs wrote
        return GenerationReport()
    old = step_old_knowledge(cfg, data, run.workers, run.record.seq)
    run.record.old_generated, run.record.old_failed = old.done, old.failed
    run.account.generation(old.engine_time(), phase="old knowledge")
    return old


def _route(cfg: JobConfig, run: RunContext, data: JobData) -> pl.DataFrame:
    return step_route(cfg, data, incremental=run.incremental)


def _earlier_knowledge(run: RunContext, data: JobData) -> pa.Table:
    """Every entity's newest knowledge (the latest view), or old knowledge alone (paper mode, full run)."""
    paths = run.paths
    if data.split.mode == "paper" and not run.incremental:
        return read_knowledge(paths.old_knowledge).select("entity_type", "entity_id", "knowledge").to_arrow()
    return (
        latest_view(paths.knowledge, paths.old_knowledge, ["entity_type", "entity_id", "knowledge"])
        .drop("store")
        .to_arrow()
    )


def _plan(cfg: JobConfig, run: RunContext, data: JobData, routing: pl.DataFrame) -> Planned:
    rec = run.record
    brands = catalogue_brands(data.dataset.items)
    task = knowledge_task(cfg, run.decoder, rec.run_id, data.dataset.domain, run.paths.pools, brands=brands)
    store = run.paths.knowledge  # the index, no texts; then the planned entities' earlier texts alone
    index, resuming = read_index(store), rec.run_id if run.resuming else None
    plan = plan_run(
        data.dataset,
        data.split,
        routing,
        run.decoder.card.pool,
        index,
        task.config_hash,
        run.paths.work / SOURCE_CACHE,
        resuming,
        run.keep_existing,
    )  # hashes: changed inputs only
    todo, rec.given_up = drop_given_up(plan.todo, store, cfg.generation.give_up_after, task.config_hash, rec.run_id)
    earlier = earlier_texts(index, resuming, todo, lambda rows: knowledge_at(store, rows))
    for req in todo:  # its own earlier text is an entity's likeliest draft
        req.earlier = earlier.get(req.key)
    rec.entities_new, rec.entities_changed, rec.entities_unchanged = plan.new, plan.changed, plan.unchanged
    log.info("run %s: %d new, %d changed, %d unchanged entities", rec.run_id, plan.new, plan.changed, plan.unchanged)
    if plan.other_config:
        verb = "kept (--keep-existing)" if run.keep_existing else "regenerated"
        log.warning(
            "%d entities have rows another config wrote (model, decoder, generation rules or prompt "
            "version differ): %s",
            plan.other_config,
            verb,
        )
    _start_workers(cfg, run, len(todo))  # the run's size is known now; a run with nothing to do starts none
    return Planned(task, todo, plan.resumed, plan.other_config)


def _pools(cfg: JobConfig, run: RunContext, data: JobData, planned: Planned) -> Work:
    need = run.decoder.card.pool
    if need == "none":  # a decoder that drafts from no pool: none to build
        return Work(planned.task, planned.todo)
    sizes = step_build_pools(cfg, _earlier_knowledge(run, data), pool_need=need)
    if need != "routed":
        return Work(planned.task, planned.todo)
    if cfg.routing.online_pools:  # groups without a pool get one growing in the workers as they write
        return Work(replace(planned.task, online_pools=True), planned.todo)
    todo, first_wave = split_first_wave(planned.todo, set(sizes), cfg.routing.first_wave)
    return Work(planned.task, todo, first_wave)


def _new_knowledge(cfg: JobConfig, run: RunContext, data: JobData, work: Work, resumed: int) -> GenerationReport:
    check_pool_store(run.decoder, run.paths)
    new, task = GenerationReport(), work.task
    rebuilt = run.paths.work / "pools-second-wave"  # a new store: the actors' pool caches know the first
    if work.first_wave:  # groups with no earlier knowledge: a first share drafts alone, then pools from it
        log.info(
            "first wave: %d entities of groups with no earlier knowledge; the pools are rebuilt from their "
            "texts before the other %d",
            len(work.first_wave),
            len(work.todo),
        )
        _write(cfg, run, data, work.first_wave, task, "new knowledge, first wave", new)
        with run.account.phase("pools"):
            step_build_pools(cfg, _earlier_knowledge(run, data), rebuilt, pool_need=run.decoder.card.pool)
        task = replace(task, pool_store=str(rebuilt))
    _write(cfg, run, data, work.todo, task, "new knowledge", new)
    if work.first_wave:  # the job's pool store is the one built from every text (laser build-pools' place)
        shutil.rmtree(run.paths.pools, ignore_errors=True)
        rebuilt.rename(run.paths.pools)
    # a resumed run counts its whole work: rows it wrote before it was killed too
    run.record.generated, run.record.failed = resumed + new.done, new.failed
    run.account.generation(new.engine_time())
    return new


def _write(
    cfg: JobConfig,
    run: RunContext,
    data: JobData,
    todo: list[GenerationRequest],
    task: DecodeTask,
    desc: str,
    new: GenerationReport,
) -> None:
    """``todo`` generated into the knowledge store, counted into ``new``; each batch of requests gets its
    prompt inputs (histories, item rows) as it is sent."""
    payloads = partial(attach_payloads, data.dataset, data.split)
    write_knowledge(cfg, todo, task, run.paths.knowledge, desc, run.workers, run.record.seq, new, payloads)


def _latest(run: RunContext) -> None:
    paths = run.paths
    update_latest(paths.root, paths.knowledge, paths.old_knowledge, run_id=run.record.run_id)


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
            run = RunContext(paths, incremental, record, decoder, workers, account, keep_existing, resuming, previous)
            ran = _run_steps(cfg, run, ledger, data)
            account.engine_ready_s = max(workers.ready_s, default=0.0)
        record.status = "partial" if record.failed or record.old_failed else "succeeded"
        record.finished = utc_now()
        ledger.save(record)
    return _close_run(cfg, run, ran)


def _run_steps(cfg: JobConfig, run: RunContext, ledger: RunLedger, data: JobData | None) -> Ran:
    """The steps, top to bottom, each taking what it reads and returning what it made; the ledger row is
    saved after each. A step that raises marks the run failed (ledger row and metrics) and the error goes on."""
    step = partial(_step, run, ledger)
    try:
        with step("load", "load"):
            data = _load(cfg, run, data)
        with step("old knowledge", "old knowledge"):
            old = _old_knowledge(cfg, run, data)
        with step("route", "route"):
            routing = _route(cfg, run, data)
        with step("plan", "plan"):
            planned = _plan(cfg, run, data, routing)
        with step("pools", "pools"):
            work = _pools(cfg, run, data, planned)
        with step("new knowledge", None):  # it times its own parts
            new = _new_knowledge(cfg, run, data, work, planned.resumed)
        with step("latest view", "latest view"):
            _latest(run)
    except BaseException as exc:
        run.record.status, run.record.finished = "failed", utc_now()
        run.record.error = f"{type(exc).__name__}: {exc}"[:2000]
        ledger.save(run.record)
        figures: dict[str, object] = {"record": asdict(run.record), "run_id": run.record.run_id}
        figures["time"] = run.account.to_json()
        _push_metrics(cfg, run.paths, figures)
        raise
    return Ran(data, old, new, planned.other_config, len(work.first_wave))


@contextmanager
def _step(run: RunContext, ledger: RunLedger, name: str, phase: str | None) -> Iterator[None]:
    """One step: logged, timed as the time account's ``phase`` (None: it times its own parts), and the
    ledger row saved after it (what the run has done so far, should it be killed)."""
    log.info("step: %s", name)
    with run.account.phase(phase) if phase else nullcontext():
        yield
    ledger.save(run.record)


def _close_run(cfg: JobConfig, run: RunContext, ran: Ran) -> JobSummary:
    """The closing summary of a finished run, written to ``summary.json`` and pushed as metrics."""
    paths, record = run.paths, run.record
    summary = JobSummary.of(cfg, ran.old, ran.new, paths.knowledge, 0.0)
    summary.run_id, summary.mode, summary.record = record.run_id, "incremental" if run.incremental else "full", record
    summary.other_config, summary.first_wave = ran.other_config, ran.first_wave
    summary.skipped = skipped_entities(ran.data.dataset, ran.data.split)
    summary.input_notes = dict(ran.data.dataset.notes)
    summary.time = run.account.close()
    summary.wall_s = run.account.wall_s
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
    if decoder.card.pool != "none" and not (paths.pools / "manifest.json").exists():
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
    todo = pending(new_requests(data.dataset, data.split, pool_routes(decoder.card.pool, routing)), paths.knowledge)
    return write_knowledge(cfg, todo, task, paths.knowledge, "new knowledge", workers)


__all__ = [
    "RunContext",
    "check_job",
    "read_routing",
    "run_job",
    "step_build_pools",
    "step_generate",
    "step_old_knowledge",
    "step_route",
    "worker_group",
]
