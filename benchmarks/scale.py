"""`laser bench scale`: time and peak memory of every stage but generation, at growing catalogue sizes.

For each size (users + items = entities; ``item_share`` of them items) a synthetic catalogue is generated
(:func:`pipelines.data.synthetic.scale_catalogue`: lognormal activity, power-law popularity, ~``mean_history``
interactions a user) and saved as Parquet tables; with a dataset config the bench measures that dataset
once instead. Then each stage runs the project's own functions in a fresh process:

load_split   ``load_dataset`` (format table) + ``split_old_new`` (mode latest)
lightgcn     ``router.train_lightgcn``, ``lightgcn_epochs`` epochs, recall@k evaluated once at the end
route        ``step_route`` (attribute and K-means groups, routing and membership tables written), given
             the lightgcn stage's embeddings (attribute groups only when that stage failed)
plan         ``plan_run`` against the empty output (a first run): every entity's source hash (no cache yet),
             classified, the requests of the planned entities made without their prompt inputs (``payloads_s``:
             what attaching those a batch at a time costs the driver during generation, outside the stage)
store_write  ``KnowledgeWriter`` (the job's ``shard_rows``): one row per planned entity, a fake ~130-token text
             with its quality columns (scored before the meter: workers score their rows in the job)
latest_view  ``latest_view`` of that store
pools        the job's pools step on that store: its latest view's texts read, ``step_build_pools`` (selection,
             parts tokenised and written by Ray tasks; Ray's start-up included)
incremental  after the newest rating of ``changed_share`` of the users was flipped, on copies of the store, the
             hash cache and the pools: load + split, ``step_route`` of an incremental run (the last routing kept
             while at most ``routing.retrain_share`` of the interactions are new: here none are newer, as ratings
             were edited in place), ``plan_run`` (hashes recomputed for changed inputs alone),
             the changed rows written, the pools step again (pools whose texts changed by at most
             ``routing.pool_refresh_share`` kept; when the pools stage ran), the latest view again

Each stage process reads its inputs from the size's work folder (untimed), resets its peak resident memory
(Linux ``/proc/self/clear_refs``; ``VmHWM``), runs the stage (timed) and reports the peak resident set
during the stage: inputs held plus what the stage allocated (``start_gb``: resident at its start). Where the
peak cannot be reset, ``ru_maxrss`` of the stage process is reported (it also counts the inputs' loading).
The parent kills a stage whose resident memory passes ``max_gb`` or that runs past ``stage_timeout_s`` or
the size's budget and records it as failed; stages that need it are skipped, the rest run. Sizes whose
projected time (each stage extrapolated from the smaller sizes by its log-log slope, at least linear)
passes ``budget_s`` are skipped and say so. ``stages`` picks stages: the ones they need run too (outside
the totals, under ``setup``); lightgcn (for route) and route (for plan) only when picked. Writes JSON
(``sizes``, ``slopes``), a PNG beside it and prints a table.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

log = logging.getLogger(__name__)

STAGES = ("load_split", "lightgcn", "route", "plan", "store_write", "latest_view", "pools", "incremental")
NEEDS = {
    "lightgcn": ("load_split",),
    "route": ("load_split",),
    "pools": ("route", "store_write"),
    "plan": ("load_split",),
    "store_write": ("plan",),
    "latest_view": ("store_write",),
    "incremental": ("store_write",),
}
USES = {"route": ("lightgcn",), "plan": ("route",), "incremental": ("pools",)}  # used when they ran
TARGETS = {"total_s_at_1M": 600.0, "peak_gb_at_1M": 8.0, "slope_max": 1.1, "incremental_ratio_max": 0.10}
_CONFIG_HASH = "bench-scale"
REPEAT_UNDER_S = 60.0  # a stage faster than this runs ``repeats`` times (the "medians of 3")
_GB = 2**30


@dataclass
class ScaleSettings:
    """What `laser bench scale` measures (module docstring)."""

    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    stages: tuple[str, ...] = STAGES
    budget_s: float = 1800.0  # a size's selected stages together
    stage_timeout_s: float | None = None  # one stage process's time limit (default: what is left of budget_s)
    max_gb: float = 12.0  # a stage process resident above this is killed (recorded out of memory)
    mean_history: float = 20.0
    item_share: float = 0.1
    lightgcn_epochs: int = 1
    text_words: int = 100  # words of each fake knowledge text (the pools' input)
    changed_share: float = 0.01
    repeats: int = 1  # runs of a stage that takes under REPEAT_UNDER_S: the median is reported
    seed: int = 0
    dataset: dict[str, Any] | None = None  # a DatasetConfig's fields: measure that dataset (one size)

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"unknown stage(s) {unknown or self.stages}; known: {', '.join(STAGES)}")
        if any(n < 20 for n in self.sizes):
            raise ValueError(f"sizes must be >= 20 entities, got {self.sizes}")


def with_prerequisites(selected: tuple[str, ...]) -> list[str]:
    """The selected stages and every stage they need, in pipeline order (a stage they only use, ``USES``,
    runs when selected: ``--stages route`` routes by attribute groups alone)."""
    wanted, todo = set(), list(selected)
    while todo:
        stage = todo.pop()
        if stage not in wanted:
            wanted.add(stage)
            todo += list(NEEDS.get(stage, ()))
    return [s for s in STAGES if s in wanted]


def users_items(entities: int, item_share: float) -> tuple[int, int]:
    n_items = max(2, round(entities * item_share))
    return entities - n_items, n_items


# ---- stage processes -------------------------------------------------------------------------------------


class Meter:
    """Wall time and peak resident memory of a block, in the stage process (module docstring)."""

    def __enter__(self) -> "Meter":
        self.reset = _reset_peak()
        self.start_gb = _status_kb("VmRSS") / 2**20
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.started
        peak_kb = _status_kb("VmHWM") if self.reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.peak_gb = peak_kb / 2**20


def _status_kb(key: str) -> float:
    try:
        with open("/proc/self/status") as fh:
            return next(float(line.split()[1]) for line in fh if line.startswith(key + ":"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@dataclass
class Ctx:
    """A stage process's view of its size folder."""

    root: Path
    settings: ScaleSettings

    @property
    def data(self) -> Path:
        return self.root / "data"

    def done(self, stage: str) -> bool:
        result = self.root / "results" / f"{stage}.json"
        return result.exists() and "error" not in json.loads(result.read_text())

    def job(self) -> Any:
        from pipelines.config import JobConfig, OutputConfig, RoutingConfig

        return JobConfig(
            output=OutputConfig(path=str(self.root / "out")), routing=RoutingConfig(seed=self.settings.seed)
        )

    def dataset(self) -> Any:
        from pipelines.data.schema import Dataset

        names = ("interactions", "items", "users")
        interactions, items, users = (pl.read_parquet(self.data / f"{n}.parquet") for n in names)
        return Dataset(name="bench-scale", domain="movie", interactions=interactions, items=items, users=users)

    def split(self) -> Any:
        from pipelines.data.schema import Split

        items = pl.read_parquet(self.data / "items.parquet")
        return Split(
            old_interactions=pl.read_parquet(self.root / "split" / "old.parquet"),
            new_interactions=pl.read_parquet(self.root / "split" / "new.parquet"),
            existing_items=items.clear(),
            new_items=items.sort("item_id"),
            mode="latest",
        )

    def routing(self) -> pl.DataFrame | None:
        from pipelines.store.frames import as_frame
        from pipelines.knowledge.paths import JobPaths
        from router import read_routing

        path = JobPaths.of(self.job()).routing
        return as_frame(read_routing(path)) if self.done("route") and path.exists() else None


def _table_config(path: Path) -> Any:
    from pipelines.data.config import DatasetConfig

    return DatasetConfig(
        format="table",
        path=str(path),
        name="bench-scale",
        interactions_file="interactions.parquet",
        items_file="items.parquet",
        users_file="users.parquet",
    )


def _write_tables(ds: Any, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("interactions", "items", "users"):
        getattr(ds, name).write_parquet(folder / f"{name}.parquet")


def stage_generate(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    """Not a measured stage: the catalogue (or the configured dataset's source) the others read."""
    from pipelines.data.synthetic import scale_catalogue

    s = ctx.settings
    with meter:
        if s.dataset is None:
            n_users, n_items = users_items(int(ctx.root.name), s.item_share)
            ds = scale_catalogue(n_users, n_items, s.mean_history, s.seed)
            _write_tables(ds, ctx.data)
    if s.dataset is not None:
        return {}
    return {"users": ds.users.height, "items": ds.items.height, "interactions": ds.interactions.height}


def stage_load_split(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    from pipelines.data.config import DatasetConfig
    from pipelines.data.load import load_dataset
    from pipelines.data.split import split_old_new

    s = ctx.settings
    source = DatasetConfig(**s.dataset) if s.dataset is not None else _table_config(ctx.data)
    with meter:
        ds = load_dataset(source)
        split = split_old_new(ds, seed=s.seed, max_hist=ctx.job().split.max_hist, mode="latest")
    if s.dataset is not None:  # the later stages read the loaded tables
        _write_tables(ds, ctx.data)
    (ctx.root / "split").mkdir(exist_ok=True)
    split.old_interactions.write_parquet(ctx.root / "split" / "old.parquet")
    split.new_interactions.write_parquet(ctx.root / "split" / "new.parquet")
    return {"users": ds.users.height, "items": ds.items.height, "interactions": ds.interactions.height}


def stage_lightgcn(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    import router

    epochs = ctx.settings.lightgcn_epochs
    interactions = ctx.split().routing_interactions
    config = router.LightGCNConfig(
        positive_threshold=ctx.job().dataset.min_positive_rating,
        seed=ctx.settings.seed,
        progress=False,
        max_epochs=epochs,
        eval_every=epochs,
    )
    with meter:
        result = router.train_lightgcn(interactions, config)
    from router.embeddings import save_embeddings

    save_embeddings(result.users, ctx.root / "lightgcn-users.parquet")  # data files, never pickles
    save_embeddings(result.items, ctx.root / "lightgcn-items.parquet")
    (ctx.root / "lightgcn.json").write_text(
        json.dumps({"best_recall": result.best_recall, "best_epoch": result.best_epoch})
    )
    return {
        "epochs": result.epochs,
        "epoch_s": result.epoch_seconds,
        "recall_at_k": result.best_recall,
        "positives_users": len(result.users),
        "positives_items": len(result.items),
    }


def stage_route(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    import router
    from pipelines.knowledge.inputs import JobData
    from pipelines.knowledge.routing import step_route

    trained = None
    if ctx.done("lightgcn"):
        from router.embeddings import load_embeddings

        trained = router.LightGCNResult(
            load_embeddings(ctx.root / "lightgcn-users.parquet"),
            load_embeddings(ctx.root / "lightgcn-items.parquet"),
            **json.loads((ctx.root / "lightgcn.json").read_text()),
        )

    def given(*_: Any, **__: Any) -> Any:  # step_route trains LightGCN; the lightgcn stage already did (timed)
        if trained is None:
            raise ValueError("the lightgcn stage did not run")
        return trained

    router.train_lightgcn = given
    cfg, data = ctx.job(), JobData(ctx.dataset(), ctx.split())
    with meter:
        routing = step_route(cfg, data, write=True)
    kinds = dict(routing.group_by("pool_kind").len().iter_rows())
    return {"collaborative": trained is not None, "pool_kinds": {str(k): n for k, n in kinds.items()}}


_WORDS = (
    "enjoys warm stories about family and friendship with a gentle pace and strong characters who grow "
    "over time prefers action packed thrillers dark humour clever plots classic westerns recent dramas "
    "science fiction worlds romantic comedies slow documentaries about history nature and music rates "
    "highly films that feature memorable villains striking visuals quiet endings loud soundtracks"
).split()


def fake_texts(n: int, words: int, seed: int) -> list[str]:
    """``n`` knowledge-like texts of about ``words`` words, from a Zipf-drawn book of 500 phrases."""
    rng = np.random.default_rng(seed)
    book = [" ".join(rng.choice(_WORDS, size=int(rng.integers(4, 9)))) for _ in range(500)]
    per_text = max(1, words // 6)
    weights = 1.0 / np.arange(1, len(book) + 1) ** 1.1
    picks = rng.choice(len(book), size=(n, per_text), p=weights / weights.sum())
    return [". ".join(book[k] for k in row) + "." for row in picks]


def _entities(ctx: Ctx) -> pl.DataFrame:
    ds = ctx.dataset()
    return pl.concat(
        [
            ds.users.select(entity_type=pl.lit("user"), entity_id="user_id"),
            ds.items.select(entity_type=pl.lit("item"), entity_id="item_id"),
        ]
    )


def stage_pools(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    from pipelines.knowledge.pool_build import load_tokenizer
    from pipelines.knowledge.paths import JobPaths

    cfg = ctx.job()
    shutil.rmtree(JobPaths.of(cfg).pools, ignore_errors=True)  # a full build: nothing kept from an earlier run
    load_tokenizer(cfg.model.name)  # warm the import and the file cache (the stage loads it again)
    with meter:
        sizes = _pools_from(ctx.root / "out" / "knowledge", cfg)
    return {"pools": len(sizes), "texts": int(sum(sizes.values()))}


def _pools_from(store: Path, cfg: Any, directory: Path | None = None) -> dict[str, int]:
    """The job's pools step on a store: its latest view's texts read, the pools built (or kept) and written."""
    from pipelines.knowledge.pool_build import step_build_pools
    from pipelines.ops.schedule.latest import latest_view

    knowledge = latest_view(store, None, ["entity_type", "entity_id", "knowledge"]).drop("store").to_arrow()
    return step_build_pools(cfg, knowledge, directory)


def _plan(ds: Any, split: Any, routing: pl.DataFrame | None, store: Path, cache: Path) -> Any:
    """The job's plan step (``plan_run``): hashes from ``cache`` where inputs did not change, requests for the
    planned entities alone."""
    from pipelines.knowledge.plan import plan_run
    from pipelines.store.knowledge import read_index

    return plan_run(ds, split, routing, "routed", read_index(store), _CONFIG_HASH, cache)


def _warm_plan() -> None:
    """Import what :func:`_plan` uses before the meter starts (imports are not the stage's cost)."""
    import pipelines.knowledge.plan  # noqa: F401
    import pipelines.knowledge.requests  # noqa: F401
    import router  # noqa: F401


def stage_plan(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    _warm_plan()
    ds, split, routing = ctx.dataset(), ctx.split(), ctx.routing()
    (ctx.root / "source-hashes.parquet").unlink(missing_ok=True)
    with meter:  # a first run: its output holds no knowledge yet (never the store_write stage's)
        plan = _plan(ds, split, routing, ctx.root / "out" / "no-knowledge-yet", ctx.root / "source-hashes.parquet")
    _todo_frame(plan.todo).write_parquet(ctx.root / "plan.parquet")
    return {
        "planned": len(plan.todo),
        "new": plan.new,
        "routed": ctx.routing() is not None,
        "payloads_s": _payloads_s(ds, split, plan.todo),
    }


def _payloads_s(ds: Any, split: Any, todo: list[Any]) -> float:
    """Seconds the driver spends during generation giving the planned requests their prompt inputs, a batch at
    a time (``attach_payloads``; not in the stage's time: it happens while the workers decode)."""
    from pipelines.knowledge.job import REQUEST_BATCH
    from pipelines.knowledge.requests import attach_payloads, drop_payloads

    start = time.perf_counter()
    for i in range(0, len(todo), REQUEST_BATCH):
        attach_payloads(ds, split, todo[i : i + REQUEST_BATCH])
        drop_payloads(todo[i : i + REQUEST_BATCH])
    return time.perf_counter() - start


_TODO_COLUMNS = ("entity_type", "entity_id", "source_hash", "pool_kind", "group_id")


def _todo_frame(todo: list[Any]) -> pl.DataFrame:
    """The planned requests' keys, hashes and routes (what a knowledge row records of its request)."""
    return pl.DataFrame(
        {c: [getattr(r, c) for r in todo] for c in _TODO_COLUMNS}, schema={c: pl.Utf8 for c in _TODO_COLUMNS}
    )


_QUALITY = ("finished_eos", "repeat_4gram", "degenerate", "ended", "cut", "fragment", "n_words")


def fake_rows(todo: pl.DataFrame, words: int, seed: int) -> pl.DataFrame:
    """The planned entities with a fake text each and its quality columns, as a worker hands a row to the
    driver (workers score their texts: pipelines/knowledge/generation.py); made before the meter starts."""
    from pipelines.quality import text_quality

    texts = fake_texts(todo.height, words, seed)
    scores = [text_quality(t, "eos") for t in texts]
    return todo.with_columns(
        knowledge=pl.Series(texts), **{c: pl.Series([getattr(q, c) for q in scores]) for c in _QUALITY}
    )


def _write_rows(store: Path, rows: pl.DataFrame, run_id: str, run_seq: int, shard_rows: int) -> int:
    """One knowledge row per planned entity through the job's writer (lock, shards, commits, compaction)."""
    from pipelines.store.knowledge import KnowledgeWriter

    fixed = {
        "model": "bench",
        "decoder": "laser",
        "decoder_params": "{}",
        "prompt_version": "bench",
        "n_tokens": 120,
        "target_forwards": 40,
        "accepted_tokens": 80,
        "retrieval_s": 0.0,
        "generation_s": 1.0,
        "finish_reason": "eos",
        "run_id": run_id,
        "config_hash": _CONFIG_HASH,
    }
    with KnowledgeWriter(store, shard_rows=shard_rows, run_id=run_id, run_seq=run_seq) as writer:
        for row in rows.iter_rows(named=True):
            writer.add({**row, **fixed})
    return writer.rows_written


def stage_store_write(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    rows = fake_rows(pl.read_parquet(ctx.root / "plan.parquet"), ctx.settings.text_words, ctx.settings.seed + 1)
    shutil.rmtree(ctx.root / "out" / "knowledge", ignore_errors=True)  # a first run's store
    with meter:
        written = _write_rows(ctx.root / "out" / "knowledge", rows, "bench-full", 1, ctx.job().output.shard_rows)
    shards = len(list((ctx.root / "out" / "knowledge").glob("part-*.parquet")))
    return {"rows": written, "shards": shards}


def stage_latest_view(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    from pipelines.ops.schedule.latest import latest_view

    with meter:
        view = latest_view(ctx.root / "out" / "knowledge")
    return {"rows": view.height}


def changed_users(interactions: pl.DataFrame, share: float, seed: int) -> list[str]:
    """A seeded ``share`` (at least one) of the users with interactions."""
    users = interactions["user_id"].unique().sort()
    n = max(1, round(share * users.len()))
    return users.sample(n, seed=seed).sort().to_list()


def flip_newest(interactions: pl.DataFrame, users: list[str]) -> pl.DataFrame:
    """The newest rating of each listed user flipped (high -> 1, low -> 5), timestamp kept."""
    newest = pl.col("timestamp") == pl.col("timestamp").max().over("user_id")
    flipped = pl.when(pl.col("rating") >= 3).then(1.0).otherwise(5.0).cast(interactions.schema["rating"])
    return interactions.with_columns(
        rating=pl.when(pl.col("user_id").is_in(users) & newest).then(flipped).otherwise(pl.col("rating"))
    )


def stage_incremental(ctx: Ctx, meter: Meter) -> dict[str, Any]:
    from pipelines.data.load import load_dataset
    from pipelines.data.split import split_old_new
    from pipelines.knowledge.inputs import JobData
    from pipelines.knowledge.routing import step_route
    from pipelines.ops.schedule.latest import latest_view

    _warm_plan()
    s, edited = ctx.settings, ctx.root / "data-edited"
    ds = ctx.dataset()
    users = changed_users(ds.interactions, s.changed_share, s.seed)
    ds.interactions = flip_newest(ds.interactions, users)
    _write_tables(ds, edited)
    del ds
    # copies: the full run's store, hash cache and pools stay as they were
    store, cache, pools, parts = (
        ctx.root / "out" / "knowledge-incremental",
        ctx.root / "hashes-incremental.parquet",
        ctx.root / "out" / "pools-incremental",
        {},
    )
    for source, copy in ((ctx.root / "out" / "knowledge", store), (ctx.root / "out" / "pools", pools)):
        shutil.rmtree(copy, ignore_errors=True)
        if source.exists():
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns(".run.lock*"))
    shutil.copyfile(ctx.root / "source-hashes.parquet", cache)
    cfg, with_pools = ctx.job(), ctx.done("pools")
    with meter:
        tick = time.perf_counter()
        ds = load_dataset(_table_config(edited))
        split = split_old_new(ds, seed=s.seed, max_hist=cfg.split.max_hist, mode="latest")
        parts["load_split_s"], tick = time.perf_counter() - tick, time.perf_counter()
        routing = step_route(cfg, JobData(ds, split), incremental=True) if ctx.done("route") else None
        parts["route_s"], tick = time.perf_counter() - tick, time.perf_counter()
        plan = _plan(ds, split, routing, store, cache)
        parts["plan_s"], tick = time.perf_counter() - tick, time.perf_counter()
        todo = _todo_frame(plan.todo)
        rows = fake_rows(todo, s.text_words, s.seed + 2)  # the workers' rows (their scoring is not the driver's)
        parts["rows_s_untimed"], tick = time.perf_counter() - tick, time.perf_counter()
        _write_rows(store, rows, "bench-incremental", 2, cfg.output.shard_rows)
        parts["write_s"], tick = time.perf_counter() - tick, time.perf_counter()
        if with_pools:
            _pools_from(store, cfg, pools)
            parts["pools_s"], tick = time.perf_counter() - tick, time.perf_counter()
        latest_view(store)
        parts["latest_s"] = time.perf_counter() - tick
    meter.s -= parts["rows_s_untimed"]
    return {
        "changed_users": len(users),
        "planned": len(plan.todo),
        "changed": plan.changed,
        "unchanged": plan.unchanged,
        "pools_included": with_pools,
        **parts,
    }


STAGE_FUNCS: dict[str, Callable[[Ctx, Meter], dict[str, Any]]] = {
    "generate": stage_generate,
    "load_split": stage_load_split,
    "lightgcn": stage_lightgcn,
    "route": stage_route,
    "pools": stage_pools,
    "plan": stage_plan,
    "store_write": stage_store_write,
    "latest_view": stage_latest_view,
    "incremental": stage_incremental,
}


def run_stage(stage: str, root: Path) -> None:
    """The body of a stage process: run ``stage`` for the size folder ``root``, write its result JSON."""
    settings = ScaleSettings(**_tuples(json.loads((root / "settings.json").read_text())))
    meter = Meter()
    out = root / "results" / f"{stage}.json"
    try:
        extra = STAGE_FUNCS[stage](Ctx(root, settings), meter)
        result = {
            "s": meter.s,
            "peak_gb": meter.peak_gb,
            "start_gb": meter.start_gb,
            "peak_reset": meter.reset,
            **extra,
        }
    except Exception as exc:  # recorded, never raised: the bench goes on with the other stages
        log.exception("stage %s failed", stage)
        result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    out.write_text(json.dumps(result, default=str))


def _tuples(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}


# ---- the parent: sizes, processes, projection, report ------------------------------------------------------


@dataclass
class StageRun:
    """What the parent saw of one stage process."""

    result: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    sampled_peak_gb: float = 0.0


def spawn_stage(stage: str, root: Path, timeout_s: float, max_gb: float) -> StageRun:
    """Run one stage process; kill it past ``timeout_s`` or ``max_gb`` resident (recorded as its error)."""
    import psutil

    (root / "logs").mkdir(exist_ok=True)
    result_path = root / "results" / f"{stage}.json"
    result_path.unlink(missing_ok=True)
    run, started, killed = StageRun(), time.perf_counter(), None
    with open(root / "logs" / f"{stage}.log", "w") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale", stage, str(root)], stdout=logf, stderr=subprocess.STDOUT
        )
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = watched.memory_info().rss / _GB
            except psutil.Error:
                rss = 0.0
            run.sampled_peak_gb = max(run.sampled_peak_gb, rss)
            elapsed = time.perf_counter() - started
            if rss > max_gb:
                killed = f"out of memory: resident {rss:.1f} GB > max {max_gb:g} GB after {elapsed:.0f} s (killed)"
            elif elapsed > timeout_s:
                killed = f"too slow: still running after {timeout_s:.0f} s (killed)"
            if killed:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.1)
    run.wall_s = time.perf_counter() - started
    if killed:
        run.result = {"error": killed}
    elif result_path.exists():
        run.result = json.loads(result_path.read_text())
    else:
        run.result = {
            "error": f"the stage process exited {proc.returncode} without a result; see "
            f"{root / 'logs' / (stage + '.log')}"
        }
    if "error" in run.result:
        run.result["sampled_peak_gb"] = round(run.sampled_peak_gb, 3)
        result_path.write_text(json.dumps(run.result))
    return run


def loglog_slope(n0: float, y0: float, n1: float, y1: float) -> float | None:
    if min(n0, y0, n1, y1) <= 0 or n0 == n1:
        return None
    return math.log(y1 / y0) / math.log(n1 / n0)


def project(sizes: dict[str, Any], stage: str, n: int) -> float | None:
    """The stage's seconds at ``n`` from the measured sizes below it: extrapolated by its last log-log slope
    (at least 1: small sizes carry fixed costs); None when it was never measured."""
    seen = sorted(
        (int(k), v["stages"][stage]["s"])
        for k, v in sizes.items()
        if int(k) < n and "s" in v.get("stages", {}).get(stage, {})
    )
    if not seen:
        return None
    slope = loglog_slope(*seen[-2], *seen[-1]) if len(seen) > 1 else None
    n0, s0 = seen[-1]
    return s0 * (n / n0) ** max(1.0, slope or 1.0)


def _failed_before(sizes: dict[str, Any], stage: str) -> str | None:
    for k, v in sorted(sizes.items(), key=lambda kv: int(kv[0])):
        entry = v.get("stages", {}).get(stage, {})
        if "error" in entry:
            return f"failed at {k} entities: {entry['error']}"
    return None


_DATA_KEYS = ("mean_history", "item_share", "seed", "dataset")


def reusable(root: Path, settings: ScaleSettings) -> bool:
    """Whether ``root`` holds the stages of an earlier run on the same data (same generation settings)."""
    path = root / "settings.json"
    if not path.exists():
        return False
    before = ScaleSettings(**_tuples(json.loads(path.read_text())))
    return all(getattr(before, k) == getattr(settings, k) for k in _DATA_KEYS)


def _reused(root: Path, stage: str, resume: bool) -> dict[str, Any] | None:
    path = root / "results" / f"{stage}.json"
    if not resume or not path.exists():
        return None
    result = json.loads(path.read_text())
    return None if "error" in result else result | {"reused": True}


def _spawn_or_reuse(stage: str, root: Path, timeout_s: float, max_gb: float, resume: bool) -> StageRun:
    reused = _reused(root, stage, resume)
    return StageRun(reused) if reused is not None else spawn_stage(stage, root, timeout_s, max_gb)


def run_size(
    n: int, root: Path, settings: ScaleSettings, earlier: dict[str, Any], resume: bool = False
) -> dict[str, Any]:
    """Generate, then run the selected stages (and what they need) for one size; with ``resume`` the
    generation and the needed stages an earlier run finished in ``root`` are reused, not run again."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "results").mkdir(exist_ok=True)
    (root / "settings.json").write_text(json.dumps(asdict(settings)))
    entry: dict[str, Any] = {"stages": {}, "setup": {}, "load_average": {"start": _load()}}
    gen = _spawn_or_reuse("generate", root, settings.budget_s, settings.max_gb, resume)
    if "error" in gen.result:
        return entry | {"error": f"generation: {gen.result['error']}"}
    entry.update({k: gen.result[k] for k in ("users", "items", "interactions") if k in gen.result})
    entry["generate_s"] = gen.result.get("s")
    used = 0.0
    for stage in with_prerequisites(settings.stages):
        into = entry["stages"] if stage in settings.stages else entry["setup"]
        missing = [d for d in NEEDS.get(stage, ()) if "error" in _outcome(entry, d) or "skipped" in _outcome(entry, d)]
        failed = _failed_before(earlier, stage)
        if missing:
            into[stage] = {"skipped": f"needs {', '.join(missing)}, which did not finish"}
            continue
        if failed:
            into[stage] = {"skipped": failed}
            continue
        left = settings.budget_s - used
        if left <= 0:
            into[stage] = {"skipped": f"the size's budget ({settings.budget_s:g} s) was spent"}
            continue
        log.info("%d entities: %s", n, stage)
        timeout = min(left, settings.stage_timeout_s or left)
        run = _spawn_or_reuse(stage, root, timeout, settings.max_gb, resume and stage not in settings.stages)
        if stage in settings.stages:
            run = _repeated(stage, root, run, settings, timeout)
        used += run.wall_s
        if not run.result.get("reused"):  # what ran it where: merged files mix runs
            run.result |= {"load_average_end": _load(), "commit": (code_version() or {}).get("commit")}
        into[stage] = run.result
        if stage == "load_split" and "users" in run.result:
            entry.update({k: run.result[k] for k in ("users", "items", "interactions")})
    entry["load_average"]["end"] = _load()
    return with_totals(entry)


def _repeated(stage: str, root: Path, first: StageRun, settings: ScaleSettings, timeout_s: float) -> StageRun:
    """``first`` and, when it took under :data:`REPEAT_UNDER_S`, ``repeats - 1`` more runs of the stage: the
    median seconds (``runs_s``: each run's), the highest peak. A failed rerun is recorded as the result."""
    if settings.repeats < 2 or first.result.get("reused") or first.result.get("s", REPEAT_UNDER_S) >= REPEAT_UNDER_S:
        return first
    runs = [first] + [spawn_stage(stage, root, timeout_s, settings.max_gb) for _ in range(settings.repeats - 1)]
    failed = next((r for r in runs if "s" not in r.result), None)
    if failed is not None:
        return failed
    times = [r.result["s"] for r in runs]
    middle = runs[sorted(range(len(runs)), key=lambda i: times[i])[len(runs) // 2]]
    result = middle.result | {"runs_s": times, "peak_gb": max(r.result["peak_gb"] for r in runs)}
    return StageRun(result, sum(r.wall_s for r in runs), max(r.sampled_peak_gb for r in runs))


def _load() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (the machine may be shared)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def with_totals(entry: dict[str, Any]) -> dict[str, Any]:
    """``total_s`` and ``peak_gb`` over the stages that finished; ``incremental_ratio``: the incremental stage's
    seconds over the other stages' together."""
    done = {k: v for k, v in entry["stages"].items() if "s" in v}
    entry["finished"] = [s for s in STAGES if s in done]  # what total_s adds up
    entry["total_s"] = sum(v["s"] for v in done.values())
    entry["peak_gb"] = max((v["peak_gb"] for v in done.values()), default=0.0)
    full = sum(v["s"] for k, v in done.items() if k != "incremental")
    entry.pop("incremental_ratio", None)
    if "incremental" in done and full > 0:
        entry["incremental_ratio"] = done["incremental"]["s"] / full
    return entry


def merge_sizes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` sizes with ``new`` measured over them, stage by stage (a rerun of some stages keeps the rest)."""
    merged = {k: with_totals(dict(v, stages=dict(v.get("stages", {})))) for k, v in old.items()}
    for key, entry in new.items():
        stages = {**merged.get(key, {}).get("stages", {}), **entry.get("stages", {})}
        merged[key] = with_totals({**merged.get(key, {}), **entry, "stages": stages})
    return merged


def _outcome(entry: dict[str, Any], stage: str) -> dict[str, Any]:
    return entry["stages"].get(stage) or entry["setup"].get(stage) or {"skipped": "not run"}


def slopes(sizes: dict[str, Any], key: str = "s") -> dict[str, dict[str, float]]:
    """Per stage (and ``total``), the log-log slope of ``key`` between consecutive measured sizes."""
    order = sorted(sizes, key=int)
    out: dict[str, dict[str, float]] = {}
    total = "total_s" if key == "s" else "peak_gb"
    for stage in [*STAGES, "total"]:
        points = [
            (int(k), sizes[k].get(total) if stage == "total" else sizes[k]["stages"].get(stage, {}).get(key))
            for k in order
        ]
        points = [(n, y) for n, y in points if y]
        raw = {
            f"{a[0]}-{b[0]}": loglog_slope(*a, *b)
            for a, b in zip(points, points[1:])
            if stage != "total" or _same_stages(sizes, a[0], b[0])
        }
        pairs = {k: round(v, 3) for k, v in raw.items() if v is not None}
        if pairs:
            out[stage] = pairs
    return out


def _same_stages(sizes: dict[str, Any], a: int, b: int) -> bool:
    """Whether two sizes' totals add up the same stages (else their slope compares different work)."""
    return sizes[str(a)].get("finished") == sizes[str(b)].get("finished")


def run_scale_bench(
    json_out: Path, settings: ScaleSettings, work: Path | None = None, merge: bool = False
) -> dict[str, Any]:
    """Measure every size (module docstring); prints a table, writes ``json_out`` and a PNG beside it. With
    ``merge`` the sizes ``json_out`` already holds are kept (what this run measures replaces them stage by
    stage) and project the sizes of this run, and a size folder in ``work`` from an earlier run on the same
    data is resumed: its catalogue and the finished stages the selected ones need are reused."""
    from benchmarks.report import machine_info, save_report, versions

    json_out = Path(json_out)
    earlier = json.loads(json_out.read_text())["sizes"] if merge and json_out.exists() else {}
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="laser-bench-scale-")) if work is None else Path(work)
    sizes: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    try:
        for n in [0] if settings.dataset is not None else sorted(settings.sizes):
            known = merge_sizes(earlier, sizes)
            projected = {s: project(known, s, n) for s in settings.stages if not _failed_before(sizes, s)}
            total = sum(p for p in projected.values() if p is not None)
            if total > settings.budget_s:
                skipped[str(n)] = f"projected {total:.0f} s > --budget-s {settings.budget_s:g}"
                log.warning("%d entities skipped: %s", n, skipped[str(n)])
                continue
            root = work / (str(n) if n else "dataset")
            resume = merge and reusable(root, settings)
            if not resume:
                shutil.rmtree(root, ignore_errors=True)
            entry = run_size(n, root, settings, sizes, resume)
            key = str(n or entry.get("users", 0) + entry.get("items", 0))
            sizes[key] = entry | ({"projected_s": round(total, 1)} if total else {})
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    sizes = merge_sizes(earlier, sizes)
    result = {
        "settings": asdict(settings),
        "merged": merge,
        "targets": TARGETS,
        "sizes": sizes,
        "skipped_sizes": skipped,
        "slopes": slopes(sizes),
        "peak_slopes": slopes(sizes, "peak_gb"),
        "machine": machine_info(),
        "versions": versions(),
        "code": code_version(),
    }
    save_report(result, json_out)
    plot(result, json_out.with_suffix(".png"))
    print_result(result)
    return result


def code_version() -> dict[str, Any] | None:
    """The commit the stage processes ran (the working directory's, or ``$LASER_BENCH_COMMIT`` for a checkout
    without git) and how many tracked files differed from it."""
    if os.environ.get("LASER_BENCH_COMMIT"):
        return {"commit": os.environ["LASER_BENCH_COMMIT"], "modified_files": 0}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": commit.strip(), "modified_files": dirty.count("\n")}


def plot(result: dict[str, Any], path: Path) -> None:
    """Seconds and peak GB of each stage against entities (log-log), a linear guide from the smallest size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    order = sorted(sizes, key=int)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label, target in (
        (axes[0], "s", "seconds", TARGETS["total_s_at_1M"]),
        (axes[1], "peak_gb", "peak resident GB", TARGETS["peak_gb_at_1M"]),
    ):
        for stage in STAGES:
            pts = [(int(k), sizes[k]["stages"][stage][key]) for k in order if key in sizes[k]["stages"].get(stage, {})]
            if pts:
                ax.plot(*zip(*pts), "o-", label=stage, markersize=4)
        total_key = "total_s" if key == "s" else "peak_gb"
        totals = [
            (int(k), sizes[k][total_key], tuple(sizes[k].get("finished", ()))) for k in order if sizes[k].get(total_key)
        ]
        for i, segment in enumerate(_segments(totals)):  # a total is only joined to totals of the same stages
            ax.plot(
                *zip(*segment),
                "ks-",
                lw=2,
                markersize=5,
                label=("all stages (joined where the same stages finished)" if key == "s" else "peak (any stage)")
                if i == 0
                else None,
            )
        if totals:
            n0, y0, _ = totals[0]
            ax.plot([n0, n0 * 100], [y0, y0 * 100], "k:", lw=1, label="linear from the smallest")
        ax.axhline(target, color="tab:red", ls="--", lw=1, label="1M target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entities (users + items)")
        ax.set_ylabel(label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle(
        f"laser bench scale: every stage but generation ({result['settings']['lightgcn_epochs']} LightGCN epoch(s))"
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _segments(points: list[tuple[int, float, tuple]]) -> list[list[tuple[int, float]]]:
    """Consecutive (n, y) points grouped while their third element (the finished stages) stays the same."""
    out: list[list[tuple[int, float]]] = []
    for i, (n, y, key) in enumerate(points):
        if i == 0 or key != points[i - 1][2]:
            out.append([])
        out[-1].append((n, y))
    return out


def _cell(entry: dict[str, Any]) -> str:
    if "s" in entry:
        return f"{entry['s']:.1f} s / {entry['peak_gb']:.2f} GB"
    return "failed" if "error" in entry else "skipped" if "skipped" in entry else ""


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    sizes, order = result["sizes"], sorted(result["sizes"], key=int)
    table = Table(title="bench scale: seconds / peak resident GB per stage (log-log slope between sizes)")
    table.add_column("stage")
    for k in order:
        table.add_column(f"{int(k):,} entities", justify="right")
    table.add_column("slopes", justify="right")
    for stage in [s for s in STAGES if any(s in sizes[k]["stages"] for k in order)]:
        table.add_row(
            stage,
            *(_cell(sizes[k]["stages"].get(stage, {})) for k in order),
            ", ".join(f"{v:.2f}" for v in result["slopes"].get(stage, {}).values()),
        )
    table.add_row(
        "all stages",
        *(f"{sizes[k]['total_s']:.1f} s / {sizes[k]['peak_gb']:.2f} GB" for k in order),
        ", ".join(f"{v:.2f}" for v in result["slopes"].get("total", {}).values()),
    )
    console = Console()
    console.print(table)
    for k in order:
        left_out = [s for s in STAGES if s in sizes[k]["stages"] and s not in sizes[k].get("finished", STAGES)]
        if left_out:
            console.print(f"{int(k):,}: all stages leaves out {', '.join(left_out)} (did not finish)")
        for stage, entry in sizes[k]["stages"].items():
            if "error" in entry or "skipped" in entry:
                console.print(f"{int(k):,} {stage}: {entry.get('error') or entry.get('skipped')}")
        if "incremental_ratio" in sizes[k]:
            console.print(
                f"{int(k):,}: incremental / full = {sizes[k]['incremental_ratio']:.3f} "
                f"(target <= {TARGETS['incremental_ratio_max']:.2f})"
            )
    for n, why in result["skipped_sizes"].items():
        console.print(f"{int(n):,} entities skipped: {why}")


if __name__ == "__main__":  # a stage process: python -m benchmarks.scale STAGE SIZE_FOLDER
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_stage(sys.argv[1], Path(sys.argv[2]))
