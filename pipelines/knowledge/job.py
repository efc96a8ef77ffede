"""The knowledge job, step by step; each step also runs alone (`laser route`, `build-pools`, `generate`).

Steps (LASER 2.2 / 4.1.1 streaming simulation):
  1. old knowledge for old histories and existing items (greedy: lossless), generated where the
     old-knowledge store lacks it;
  2. route every entity to a pool group (collaborative or attribute);
  3. build one retrieval pool per group from old knowledge, persisted in the pool store;
  4. generate new knowledge for new histories and new items with the configured decoder;
  5. the rows are written to the knowledge store as they arrive; a summary closes the job.

Job directory (``output.path``, a local path or an fsspec URI): ``knowledge/`` (new knowledge store),
``old_knowledge/`` (unless ``old_knowledge.path`` is set), ``summary.json``; and the derived files,
rebuilt every run, in the work directory (``output.path`` itself when local, see :class:`JobPaths`):
``routing.parquet`` (the pool of each entity), ``memberships.parquet`` (every group of each entity:
pools hold all members' old knowledge) and ``pools/``.
A re-run of the same config skips every entity already written in either store.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pipelines.knowledge.accounting import lightgcn_notes, pool_kind_notes, skipped_entities
from pipelines.config import JobConfig
from pipelines.data import Dataset, Split
from pipelines.data.load import load_dataset
from pipelines.data.split import split_old_new
from pipelines.knowledge.generation import DecodeTask, GenerationReport, GenerationRequest, ModelSpec, WorkerGroup
from pipelines.knowledge.store import KnowledgeWriter, done_keys, read_failures, read_knowledge
from pipelines.knowledge.prompts import PROMPT_VERSION, user_histories
from pipelines.knowledge.strategy import check_job_decoder
from pipelines.knowledge.validation import check_decoder, load_inputs
from pipelines.knowledge.sources import source_hash
from pipelines.storage import Location
from pools.build import group_key


log = logging.getLogger(__name__)

ROUTING_COLUMNS = ("entity_type", "entity_id", "pool_kind", "group_id", "reason")


@dataclass(frozen=True)
class JobPaths:
    """Where a job reads and writes. The stores, the summary, the ledger and the latest view live under
    ``root`` (a local directory or an fsspec URI); the derived files (routing, memberships, pools) under
    ``work``: ``root`` itself when it is local, else ``output.work_dir`` (see :func:`work_dir`)."""

    root: Location
    knowledge: Location
    old_knowledge: Location
    summary: Location
    work: Path
    routing: Path
    memberships: Path
    pools: Path

    @classmethod
    def of(cls, cfg: JobConfig) -> "JobPaths":
        root = Location.of(cfg.output.path)
        old = Location.of(cfg.old_knowledge.path) if cfg.old_knowledge.path else root / "old_knowledge"
        work = work_dir(cfg, root)
        return cls(root=root, knowledge=root / "knowledge", old_knowledge=old, summary=root / "summary.json",
                   work=work, routing=work / "routing.parquet", memberships=work / "memberships.parquet",
                   pools=work / "pools")


def work_dir(cfg: JobConfig, root: Location) -> Path:
    """The local directory of the derived files: the output itself, ``output.work_dir``, or a cache folder
    named after the output URI."""
    if cfg.output.work_dir:
        return Path(cfg.output.work_dir)
    if root.local:
        return root.local_path
    from laser.models import cache_dir

    return cache_dir() / "work" / hashlib.sha256(str(root).encode()).hexdigest()[:16]


@dataclass
class JobData:
    """The loaded dataset and its old/new split."""

    dataset: Dataset
    split: Split


def load_job_data(cfg: JobConfig) -> JobData:
    """Load the configured dataset and split it into old and new (seeded)."""
    ds = load_dataset(cfg.dataset)
    sp = cfg.split
    split = split_old_new(ds, seed=cfg.dataset.seed, max_hist=sp.max_hist, new_item_fraction=sp.new_item_fraction,
                          new_count=sp.new_count)
    log.info("split: %d old / %d new interactions, %d existing / %d new items", split.old_interactions.height,
             split.new_interactions.height, split.existing_items.height, split.new_items.height)
    return JobData(ds, split)


# ---- requests ------------------------------------------------------------------------------------

def user_requests(interactions: pl.DataFrame, items: pl.DataFrame, users: list[str] | None = None,
                  routes: dict[tuple[str, str], dict[str, Any]] | None = None) -> list[GenerationRequest]:
    """One request per user with interactions (restricted to ``users`` when given), history oldest first."""
    histories = user_histories(interactions, items)
    wanted = sorted(histories) if users is None else sorted(users)
    return [_request("user", uid, routes, history=[tuple(e) for e in histories.get(uid, [])]) for uid in wanted]


def item_requests(items: pl.DataFrame, routes: dict[tuple[str, str], dict[str, Any]] | None = None) -> list[GenerationRequest]:
    """One request per item row."""
    return [_request("item", row["item_id"], routes, item=row) for row in items.sort("item_id").iter_rows(named=True)]


def _request(entity_type: str, entity_id: str, routes: dict[tuple[str, str], dict[str, Any]] | None,
             **payload: Any) -> GenerationRequest:
    route = (routes or {}).get((entity_type, entity_id))
    payload["source_hash"] = source_hash(entity_type, PROMPT_VERSION, payload.get("history", payload.get("item")))
    if route is None or route.get("pool_kind") is None:
        return GenerationRequest(entity_type, entity_id, **payload)
    key = group_key(entity_type, route["pool_kind"], route["group_id"])
    return GenerationRequest(entity_type, entity_id, pool_key=key, pool_kind=route["pool_kind"],
                             group_id=route["group_id"], **payload)


def pending(requests: list[GenerationRequest], store: Path | Location) -> list[GenerationRequest]:
    """The requests whose entity is not yet in ``store`` (resume)."""
    done = done_keys(store)
    left = [r for r in requests if (r.entity_type, r.entity_id) not in done]
    if len(left) < len(requests):
        log.info("%s: %d of %d entities already written, skipped", store, len(requests) - len(left), len(requests))
    return left


def worker_group(cfg: JobConfig) -> WorkerGroup:
    """The job's generation actors (one model load each, shared by every pass of the job)."""
    ex = cfg.execution
    spec = ModelSpec(model=cfg.model.name, dtype=cfg.model.dtype, threads=ex.threads_per_worker, seed=cfg.dataset.seed,
                     gpus=ex.gpus_per_worker)
    return WorkerGroup(spec, ex.num_workers, ex.address)


def _task(cfg: JobConfig, decoder: str, params: dict[str, Any], max_new_tokens: int, run_id: str,
          domain: str, pool_store: Path | None, greedy: bool = False) -> DecodeTask:
    """The pass's decode task; ``greedy`` (old knowledge) ignores the job's sampling settings."""
    return DecodeTask(decoder=decoder, decoder_params=params, max_new_tokens=max_new_tokens,
                      max_prompt_tokens=cfg.generation.max_prompt_tokens, domain=domain,
                      prompt_version=PROMPT_VERSION, run_id=run_id, pool_store=str(pool_store) if pool_store else None,
                      pool_cache_size=cfg.execution.pool_cache_size, degenerate=cfg.generation.degenerate,
                      sampling=None if greedy else cfg.generation.sampling(), rules=cfg.generation.rules(),
                      retry_rules=cfg.generation.retry_rules())


def _generate(cfg: JobConfig, requests: list[GenerationRequest], task: DecodeTask, store: Path | Location, desc: str,
              workers: WorkerGroup | None) -> GenerationReport:
    todo = pending(requests, store)
    if not todo:
        return GenerationReport()
    with KnowledgeWriter(store, shard_rows=cfg.output.shard_rows, run_id=task.run_id) as writer:
        if workers is not None:
            return workers.run(todo, task, writer, slots=cfg.execution.batch_size, desc=desc)
        with worker_group(cfg) as own:
            return own.run(todo, task, writer, slots=cfg.execution.batch_size, desc=desc)


# ---- step 1: old knowledge -----------------------------------------------------------------------

def decoder_class(name: str, key: str = "decoder") -> type:
    """The registered decoder class called ``name`` (entry-point plug-ins included)."""
    import laser

    decoders = laser.available_decoders()
    if name not in decoders:
        raise ValueError(f"{key}.name: unknown decoder {name!r}; available: {sorted(decoders)}")
    return decoders[name]


def old_knowledge_params(decoder: str) -> dict[str, Any]:
    """The parameters under which ``decoder`` writes the target's greedy text (old knowledge is lossless)."""
    params = decoder_class(decoder, "old_knowledge.decoder").greedy_params()
    if params is None:
        raise ValueError(f"old_knowledge.decoder: decoder {decoder!r} cannot write greedy text; "
                         "choose one whose greedy_params() is not None (e.g. autoregressive)")
    return params


def step_old_knowledge(cfg: JobConfig, data: JobData, workers: WorkerGroup | None = None) -> GenerationReport:
    """Step 1: old knowledge for every user with an old history and every existing item, where missing."""
    paths = JobPaths.of(cfg)
    ds, split = data.dataset, data.split
    requests = user_requests(split.old_interactions, ds.items) + item_requests(split.existing_items)
    if not cfg.old_knowledge.generate_missing:
        missing = pending(requests, paths.old_knowledge)
        log.info("old knowledge: generation disabled; %d entities lack old knowledge", len(missing))
        return GenerationReport()
    decoder = cfg.old_knowledge.decoder
    check_decoder(decoder, old_knowledge_params(decoder), "old_knowledge.decoder")
    task = _task(cfg, decoder, old_knowledge_params(decoder),
                 cfg.old_knowledge.max_new_tokens or cfg.generation.max_new_tokens,
                 f"{cfg.resolved_run_id()}-old", ds.domain, None, greedy=True)
    return _generate(cfg, requests, task, paths.old_knowledge, "old knowledge", workers)


# ---- steps 2 and 3: route, build pools ----------------------------------------------------------

USER_ATTRIBUTES = ("gender", "age", "occupation")
ITEM_ATTRIBUTES = ("category", "sub_category", "genres", "year")


def _attribute_frame(table: pl.DataFrame, id_column: str, candidates: tuple[str, ...]) -> tuple[pl.DataFrame, list[str]]:
    """The table and the attribute hierarchy it supports; a constant "all" group when it has none."""
    hierarchy = [c for c in candidates if c in table.columns]
    if not hierarchy:
        return table.select(id_column, all=pl.lit("all")), ["all"]
    return table, hierarchy


def _groups(cfg: JobConfig, data: JobData) -> dict[str, tuple[pl.DataFrame, pl.DataFrame | None]]:
    """Per entity type: (attribute groups, collaborative groups or None), over every user and item."""
    import router

    ds, split, rc = data.dataset, data.split, cfg.routing
    lg = router.LightGCNConfig(positive_threshold=cfg.dataset.min_positive_rating, seed=rc.seed, progress=False,
                               **rc.lightgcn)
    try:
        emb = router.train_lightgcn(split.old_interactions, lg)
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


def step_route(cfg: JobConfig, data: JobData) -> pl.DataFrame:
    """Step 2: route every user and item (routing table saved as Parquet) and save group memberships."""
    import router

    paths = JobPaths.of(cfg)
    groups = _groups(cfg, data)
    old = data.split.old_interactions
    policies = {"user": cfg.routing.user_policy, "item": cfg.routing.item_policy}
    tables, members = [], []
    for etype, (attr, collab) in groups.items():
        counts = router.interaction_counts(old, f"{etype}_id")
        tables.append(router.route(etype, attr["entity_id"].to_list(), attr, collab, counts,
                                   policy=policies[etype], warm_threshold=cfg.routing.warm_threshold))
        members.append(router.group_memberships(etype, attr, collab))
    table = pa.concat_tables(tables)
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


def load_tokenizer(model: str) -> Any:
    """The tokenizer of the job's model (pool texts must be tokenised exactly as the actors decode)."""
    import laser

    return laser.load_tokenizer(model)


def step_build_pools(cfg: JobConfig, knowledge: pa.Table | None = None) -> dict[str, int]:
    """Step 3: one pool per group from its members' old knowledge (or ``knowledge``: entity_type, entity_id,
    knowledge), persisted; returns {pool key: texts}."""
    import router
    from pools.build import PoolBuildConfig, collect_sources
    from pools.store import TokenizerFingerprint, write_store

    paths = JobPaths.of(cfg)
    if not paths.memberships.exists():
        raise FileNotFoundError(f"{paths.memberships}: no group memberships; run `laser route` first")
    memberships = router.read_routing(paths.memberships)
    if knowledge is None:
        knowledge = read_knowledge(paths.old_knowledge).select("entity_type", "entity_id", "knowledge").to_arrow()
    old = knowledge.select(["entity_type", "entity_id", "knowledge"])
    tokenizer = load_tokenizer(cfg.model.name)
    build = PoolBuildConfig(max_pool_size=cfg.routing.max_pool_size, with_global=True, on_missing="skip",
                            seed=cfg.routing.seed)
    sources = collect_sources(old, memberships, tokenizer, build)
    for etype, eid, reason in sources.skipped:
        log.warning("pools: %s %s skipped: %s", etype, eid, reason)
    write_store(paths.pools, sources.texts, TokenizerFingerprint.of(tokenizer),
                meta={"model": cfg.model.name, "run_id": cfg.resolved_run_id()})
    return sources.sizes()


# ---- step 4: new knowledge ----------------------------------------------------------------------

def decoder_routes(decoder: str, routing: pl.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    """{(entity_type, entity_id): route} for a decoder, by the pool its class declares: ``routed`` (the
    entity's group pool), ``global`` (the type's global pool) or ``none``."""
    need = decoder_class(decoder).pool
    if need == "none":
        return {}
    if need == "global":
        return {(r["entity_type"], r["entity_id"]): {"pool_kind": "global", "group_id": "all"}
                for r in routing.select("entity_type", "entity_id").iter_rows(named=True)}
    return {(r["entity_type"], r["entity_id"]): r for r in routing.iter_rows(named=True)}


def new_requests(data: JobData, routing: pl.DataFrame, decoder: str = "laser") -> list[GenerationRequest]:
    """Requests for users with new history (whole history up to the new part) and for new items."""
    ds, split = data.dataset, data.split
    routes = decoder_routes(decoder, routing)
    new_users = split.new_interactions["user_id"].unique().to_list()
    history = pl.concat([split.old_interactions, split.new_interactions])
    return user_requests(history, ds.items, new_users, routes) + item_requests(split.new_items, routes)


def step_generate(cfg: JobConfig, data: JobData, routing: pl.DataFrame,
                  workers: WorkerGroup | None = None) -> GenerationReport:
    """Step 4 + 5: new knowledge with the configured decoder, streamed into the knowledge store."""
    paths = JobPaths.of(cfg)
    check_job_decoder(cfg)
    task = new_knowledge_task(cfg, cfg.resolved_run_id(), data.dataset.domain, paths.pools)
    if decoder_class(task.decoder).pool != "none" and not (paths.pools / "manifest.json").exists():
        raise FileNotFoundError(f"{paths.pools}: no pool store; run `laser build-pools` (or `laser run`) first")
    return _generate(cfg, new_requests(data, routing, task.decoder), task, paths.knowledge, "new knowledge",
                     workers)


def new_knowledge_task(cfg: JobConfig, run_id: str, domain: str, pool_store: Path | None) -> DecodeTask:
    """The new-knowledge pass's task: the decoder ``generation.strategy`` selects (pipelines/knowledge/strategy.py)."""
    from pipelines.knowledge.strategy import new_knowledge_decoder

    dec = new_knowledge_decoder(cfg)
    return _task(cfg, dec.name, dec.params, cfg.generation.max_new_tokens, run_id, domain, pool_store)


# ---- the whole job ------------------------------------------------------------------------------

@dataclass
class JobSummary:
    """Closing numbers of a job run."""

    output: str
    run_id: str
    old: GenerationReport
    new: GenerationReport
    total_rows: int
    open_failures: int
    wall_s: float
    skipped: dict[str, int] = field(default_factory=dict)  # entities without knowledge, by reason
    input_notes: dict[str, Any] = field(default_factory=dict)  # rows the loader and the sample skipped

    @classmethod
    def of(cls, cfg: JobConfig, old: GenerationReport, new: GenerationReport, store: Path | Location,
           wall_s: float) -> "JobSummary":
        """The summary of a run whose knowledge went to ``store``."""
        return cls(output=str(store), run_id=cfg.resolved_run_id(), old=old, new=new,
                   total_rows=len(done_keys(store)), open_failures=read_failures(store).height, wall_s=wall_s)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "old": _report_json(self.old), "new": _report_json(self.new)}


def _report_json(rep: GenerationReport) -> dict[str, Any]:
    """A pass's figures for summary.json, with the derived rates and the quality shares."""
    return {**asdict(rep), "aal": rep.aal, "tokens_per_s_wall": rep.tokens_per_s,
            "tokens_per_s_decode": rep.decode_tokens_per_s, "quality": rep.quality.as_dict()}


def run_job(cfg: JobConfig) -> JobSummary:
    """All five steps; returns (and writes to ``summary.json``) the closing summary."""
    start = time.perf_counter()
    paths = JobPaths.of(cfg)
    check_job_decoder(cfg)  # before hours of old knowledge
    if cfg.old_knowledge.generate_missing:
        check_decoder(cfg.old_knowledge.decoder, old_knowledge_params(cfg.old_knowledge.decoder),
                      "old_knowledge.decoder")
    data = load_inputs(load_job_data, cfg)  # nothing is created before the inputs are known good
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.work.mkdir(parents=True, exist_ok=True)
    with worker_group(cfg) as workers:
        old = step_old_knowledge(cfg, data, workers)
        routing = step_route(cfg, data)
        step_build_pools(cfg)
        new = step_generate(cfg, data, routing, workers)
    summary = JobSummary.of(cfg, old, new, paths.knowledge, time.perf_counter() - start)
    summary.skipped, summary.input_notes = skipped_entities(data.dataset, data.split), dict(data.dataset.notes)
    paths.summary.write_text(json.dumps(summary.to_json(), indent=1))
    return summary


def print_summary(summary: JobSummary) -> None:
    """The closing summary as rich tables: per pass speed (wall and decode-only), then text quality."""
    from rich.console import Console
    from rich.table import Table

    speed = Table(title=f"laser job {summary.run_id}")
    for col in ("step", "done", "failed", "tokens", "tok/s wall", "tok/s decode", "AAL", "forwards saved"):
        speed.add_column(col, justify="right" if col != "step" else "left", no_wrap=True)
    quality = Table(title="knowledge quality (pipelines/knowledge/quality.py)")
    for col in ("step", "rows", "EOS", "repeat 4-grams", "degenerate", "greedy retries"):
        quality.add_column(col, justify="right" if col != "step" else "left", no_wrap=True)
    for name, rep in (("old knowledge", summary.old), ("new knowledge", summary.new)):
        if rep.done == rep.failed == 0:
            speed.add_row(name, "0", "0", "-", "-", "-", "-", "-")  # nothing generated in this pass
            continue
        # every accepted draft token is a target forward saved against one forward per token
        share = f" ({rep.accepted_tokens / rep.n_tokens:.0%})" if rep.n_tokens else ""
        speed.add_row(name, str(rep.done), str(rep.failed), str(rep.n_tokens), f"{rep.tokens_per_s:.1f}",
                      f"{rep.decode_tokens_per_s:.1f}", f"{rep.aal:.2f}", f"{rep.accepted_tokens}{share}")
        q = rep.quality
        quality.add_row(name, str(q.n), f"{q.finished_eos} ({q.eos_share:.0%})", f"{q.mean_repeat_4gram:.1%}",
                        str(q.degenerate), str(rep.greedy_retries))
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough that no figure is cut
        console = Console(width=max(console.width, 110))
    console.print(speed)
    console.print("tok/s wall = generated tokens / wall seconds of the pass, including actor start-up, model "
                  "load, pool loads, prefill, decoding and writing; tok/s decode = generated tokens / actor "
                  "decoding seconds (each batch once; prefill excluded; actors run in parallel).")
    console.print(quality)
    if summary.skipped:
        console.print("skipped (no new knowledge): " + "; ".join(f"{n} {why}" for why, n in summary.skipped.items()))
    if summary.input_notes:
        console.print("input: " + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in summary.input_notes.items()))
    console.print(f"knowledge rows in store: {summary.total_rows}; unresolved failures: {summary.open_failures}; "
                  f"wall {summary.wall_s:.1f}s\noutput: {summary.output}")
