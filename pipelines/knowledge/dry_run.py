"""`laser run CONFIG --dry-run`: every step but generation, then what the run would generate and cost.

It loads and splits the data, routes every entity (nothing saved), and plans as the run would
(pipelines/knowledge/plan.py), then reports the entities by type, pool kind and reason (new, changed,
config: another config wrote the row, unchanged, kept: --keep-existing), the prompt tokens of the planned
entities in the model's tokens (counted on a seeded sample of 2,000 of them, scaled), and an estimate of
the tokens to generate and the seconds the configured workers would take. Nothing is written: no knowledge, no pools, no routing files, no ledger row.

The estimate comes from what was measured: the tokens per entity of the rows the output already holds
(else ``generation.max_new_tokens``, an upper bound), and the engine throughput of the output's last run
(``summary.json``: every step, prefill included), else the shipped vLLM step-cost table scaled to the
model and the workers' threads (decode steps of ``execution.batch_size`` rows, and the prompts' prefill at
the table's widest per-token cost).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from pipelines.config import JobConfig
from pipelines.store.frames import as_frame
from pipelines.knowledge.decoders import check_job_decoders
from pipelines.knowledge.inputs import JobData, load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.plan import classify, to_generate
from pipelines.knowledge.prompts import count_prompt_tokens, entity_prompt, task_template
from pipelines.knowledge.requests import SOURCE_CACHE, new_requests, request_keys
from pipelines.knowledge.pool_build import load_tokenizer
from pipelines.knowledge.routing import step_route
from pipelines.knowledge.time_account import TimeAccount
from pipelines.knowledge.validation import load_inputs
from pipelines.store.knowledge import iter_knowledge, read_index
from pipelines.ops.schedule.ledger import RunLedger
from pipelines.store.location import Location
from pipelines.workers.layout import job_actors

if TYPE_CHECKING:
    from laser.cost import ForwardCost
    from pipelines.knowledge.records import DecodeTask

log = logging.getLogger(__name__)


@dataclass
class RunEstimate:
    """What a run would do: entity counts by (type, pool kind, reason), tokens and seconds (estimated)."""

    entities: list[dict[str, str | int]] = field(default_factory=list)
    planned: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0  # estimated
    seconds: float = 0.0  # estimated generation time with the configured workers
    workers: int = 1
    basis: str = ""  # where the rates came from
    fixed_s: float | None = None  # the last run's fixed costs (all but prefill and decode), when it had an account
    last_run: dict[str, object] | None = None  # the last run's time account (summary.json)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


PROMPT_SAMPLE = 2000  # planned entities whose prompts are rendered and counted (the rest extrapolated)


def dry_run(cfg: JobConfig, keep_existing: bool = False) -> RunEstimate:
    """The plan and cost of the next run of ``cfg`` (module docstring); writes nothing."""
    from pipelines.knowledge.job import knowledge_task

    decoder = check_job_decoders(cfg)
    paths = JobPaths.of(cfg)
    data = load_inputs(load_job_data, cfg)
    routing = step_route(cfg, data, write=False)
    task = knowledge_task(cfg, decoder, "dry-run", data.dataset.domain, paths.pools)
    stored = (paths.knowledge / "manifest.json").exists()
    unfinished = RunLedger(paths.root).unfinished(cfg.resolved_run_id()) if paths.root.exists() else None
    keys = request_keys(data.dataset, data.split, paths.work / SOURCE_CACHE, write=False)
    classified = classify(
        keys,
        read_index(paths.knowledge) if stored else _empty(),
        task.config_hash,
        resuming=unfinished.run_id if unfinished else None,
        keep_existing=keep_existing,
    )
    counts = _with_pool_kind(classified, routing, decoder.card.pool).group_by("entity_type", "pool_kind", "why").len()
    todo = to_generate(classified)
    est = RunEstimate(
        entities=[
            {"entity_type": t, "pool_kind": k, "reason": why, "entities": n}
            for t, k, why, n in counts.sort("entity_type", "pool_kind", "why").iter_rows()
        ],
        planned=todo.height,
    )
    est.prompt_tokens = _prompt_tokens(cfg, data, task, todo)
    per_entity = _tokens_per_entity(paths.knowledge if stored else None)
    est.new_tokens = int(
        sum(
            n * per_entity.get(t, cfg.generation.max_new_tokens)
            for t, n in todo.group_by("entity_type").len().iter_rows()
        )
    )
    spec, est.workers = job_actors(cfg, keys.height)
    est.seconds, est.basis = _seconds(cfg, paths, est, spec.threads)
    last = last_account(paths)
    if last is not None:
        est.fixed_s, est.last_run = last.fixed_s, last.to_json()
    return est


def last_account(paths: JobPaths) -> TimeAccount | None:
    """The time account of the output's last run (``summary.json``), or None (no run, or one before accounts)."""
    if not paths.summary.exists():
        return None
    data = json.loads(paths.summary.read_text()).get("time")
    return TimeAccount.from_json(data) if isinstance(data, dict) and data.get("wall_s") else None


def _with_pool_kind(classified: pl.DataFrame, routing: pl.DataFrame, pool_need: str) -> pl.DataFrame:
    """Each entity's pool kind as its decoder drafts: its routed group's kind, ``global`` or ``none``."""
    if pool_need != "routed":
        return classified.with_columns(pool_kind=pl.lit("global" if pool_need == "global" else "none"))
    kinds = routing.select("entity_type", "entity_id", "pool_kind")
    return classified.join(kinds, on=["entity_type", "entity_id"], how="left").with_columns(
        pl.col("pool_kind").fill_null("none")
    )


def _prompt_tokens(cfg: JobConfig, data: JobData, task: DecodeTask, todo: pl.DataFrame) -> int:
    """Prompt tokens of the planned entities: counted on a seeded sample of them, scaled to all."""
    if todo.height == 0:
        return 0
    sample = todo.sample(min(todo.height, PROMPT_SAMPLE), seed=0)
    tokenizer = load_tokenizer(cfg.model.name)
    requests = new_requests(data.dataset, data.split, {}, only=sample)
    system = task_template(task).system
    counted = sum(count_prompt_tokens(tokenizer, entity_prompt(task, r, tokenizer), system) for r in requests)
    return round(counted * todo.height / max(1, len(requests)))


def _empty() -> pl.DataFrame:
    cols = ("entity_type", "entity_id", "source_hash", "config_hash", "run_id")
    return pl.DataFrame({c: [] for c in cols}, schema={c: pl.Utf8 for c in cols}).with_columns(
        run_seq=pl.lit(None, pl.Int64), generated_at=pl.lit(None, pl.Datetime("us", "UTC"))
    )


def _tokens_per_entity(store: Path | Location | None) -> dict[str, float]:
    """Mean generated tokens per entity type over the rows the output holds (read two columns a shard)."""
    if store is None:
        return {}
    totals: Counter[str] = Counter()
    rows: Counter[str] = Counter()
    for batch in iter_knowledge(store, ["entity_type", "n_tokens"]):
        for t, n, k in as_frame(batch).group_by("entity_type").agg(pl.col("n_tokens").sum(), pl.len()).iter_rows():
            totals[t] += n
            rows[t] += k
    return {t: totals[t] / rows[t] for t in rows if rows[t]}


def _seconds(cfg: JobConfig, paths: JobPaths, est: RunEstimate, threads: int) -> tuple[float, str]:
    """Estimated generation seconds and what the rate is based on."""
    summary = paths.summary
    if summary.exists():
        rate = json.loads(summary.read_text()).get("new", {}).get("tokens_per_s_engine") or 0.0
        if rate > 0:
            return est.new_tokens / (rate * est.workers), f"the last run's engine rate, {rate:.1f} tok/s a worker"
    cost = _prior(cfg, threads)
    slots = cfg.execution.batch_size
    decode = cost.time(slots, 1) / slots  # seconds a token when slots rows decode together
    prefill = cost.time(cost.rows[-1], cost.nodes[-1]) / (cost.rows[-1] * cost.nodes[-1])
    seconds = (est.new_tokens * decode + est.prompt_tokens * prefill) / est.workers
    return seconds, (
        f"the shipped vLLM step-cost table for {threads} thread(s): {1 / decode:.0f} decode tok/s "
        f"a worker at {slots} in flight, prefill {1 / prefill:.0f} tok/s"
    )


def _prior(cfg: JobConfig, threads: int) -> ForwardCost:
    from laser.models import model_dir
    from laser.vllm.step_cost import prior_cost

    config = json.loads((Path(model_dir(cfg.model.name)) / "config.json").read_text())
    return prior_cost(config, threads)


def print_estimate(est: RunEstimate) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dry run: what the run would generate (nothing written)")
    for col in ("entity type", "pool", "reason", "entities"):
        table.add_column(col, justify="right" if col == "entities" else "left")
    for row in est.entities:
        table.add_row(*(str(row[k]) for k in ("entity_type", "pool_kind", "reason", "entities")))
    console = Console()
    console.print(table)
    console.print(
        f"to generate: {est.planned} entities, {est.prompt_tokens} prompt tokens, about {est.new_tokens} "
        f"new tokens; about {est.seconds / 60:.1f} minutes on {est.workers} worker(s) ({est.basis})"
    )
    if est.last_run is not None:
        from pipelines.knowledge.summary import time_table

        console.print(time_table(TimeAccount.from_json(est.last_run), "the output's last run: where its time went"))
        console.print(
            f"with the last run's fixed costs ({est.fixed_s:.0f} s: start-up, load, route, plan, pools, writing), "
            f"about {(est.seconds + (est.fixed_s or 0.0)) / 60:.1f} minutes in all"
        )
