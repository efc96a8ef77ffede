"""The `laser recommend` job: for each user with a new history, the top-K next items from the old
history by constrained beam search; recommendation Parquet in ``<output.path>/recommendations`` (or
``recommend.path``), resumable; then recall@K and NDCG@K against the new history (the held-out items),
written to ``recommend_eval.json`` beside it.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import polars as pl

from pipelines.knowledge.inputs import JobData, load_job_data
from pipelines.knowledge.prompts import user_histories
from pipelines.recommend.config import RecommendJobConfig
from pipelines.recommend.items import RECOMMEND_PROMPT_VERSION, item_identifiers
from pipelines.recommend.metrics import evaluate
from pipelines.recommend.store import RecommendationWriter, done_users, read_recommendations
from pipelines.recommend.worker import RecommendReport, RecommendTask, RecommendWorker, record
from pipelines.knowledge.validation import JobInputError, load_inputs
from pipelines.store.lock import output_lock
from pipelines.store.location import Location
from pipelines.workers import GenerationRequest, LocalGroup, WorkerGroup
from pipelines.workers.layout import job_actors

log = logging.getLogger(__name__)


@dataclass
class RecommendSummary:
    run_id: str
    store: str
    report: RecommendReport
    metrics: dict[str, float]


def store_path(cfg: RecommendJobConfig) -> Path:
    return Path(cfg.recommend.path) if cfg.recommend.path else Path(cfg.output.path) / "recommendations"


def held_out_items(new_interactions: pl.DataFrame) -> dict[str, set[str]]:
    """Each user's new-history items: what a good recommender should have ranked."""
    return {u: set(g["item_id"].to_list()) for (u,), g in new_interactions.group_by(["user_id"])}


def recommend_requests(old: pl.DataFrame, new: pl.DataFrame, items: pl.DataFrame) -> list[GenerationRequest]:
    """One request per user with a new history; the prompt shows the old history (may be empty: a failure)."""
    histories = user_histories(old, items)
    users = sorted(new["user_id"].unique().to_list())
    return [GenerationRequest("user", u, history=list(histories.get(u, []))) for u in users]


def check_recommend_decoder(cfg: RecommendJobConfig) -> None:
    """The decoder must rank items (``beam``, ``atspeed``) and take its parameters."""
    from pipelines.knowledge.decoders import resolve_job_decoder

    resolve_job_decoder(cfg.decoder.name, dict(cfg.decoder.params), produces="ranking")


def check_catalogue(cfg: RecommendJobConfig, identifiers: dict[str, str]) -> None:
    if cfg.recommend.K > len(identifiers):
        raise JobInputError(
            f"recommend.K={cfg.recommend.K} is larger than the number of valid items "
            f"({len(identifiers)} in the items table)"
        )


def run_recommend_job(cfg: RecommendJobConfig, group: WorkerGroup | LocalGroup | None = None) -> RecommendSummary:
    """Check the inputs, then recommend under the output's lock (one writer per output, pipelines/store/lock.py;
    a ``recommend.path`` elsewhere is also held by its own folder's lock while written). Raises
    ``LockHeld`` when another run holds it."""
    check_recommend_decoder(cfg)
    data = load_inputs(partial(load_job_data, mode="paper"), cfg)  # recommendations are scored on held-out items
    identifiers = item_identifiers(data.dataset.items, cfg.recommend.item_code_column)
    check_catalogue(cfg, identifiers)
    run_id = cfg.resolved_run_id()
    with output_lock(cfg.output.path, run_id=run_id):
        return _recommend(cfg, data, identifiers, run_id, group)


def _recommend(
    cfg: RecommendJobConfig,
    data: JobData,
    identifiers: dict[str, str],
    run_id: str,
    group: WorkerGroup | LocalGroup | None,
) -> RecommendSummary:
    """Rank for the users not yet written, then evaluate this run's rows."""
    store = store_path(cfg)
    requests = recommend_requests(data.split.old_interactions, data.split.new_interactions, data.dataset.items)
    done = done_users(store)
    todo = [r for r in requests if r.entity_id not in done]
    if len(todo) < len(requests):
        log.info("%s: %d of %d users already written, skipped", store, len(requests) - len(todo), len(requests))
    task = RecommendTask(
        decoder=cfg.decoder.name,
        decoder_params=dict(cfg.decoder.params),
        domain=data.dataset.domain,
        prompt_version=RECOMMEND_PROMPT_VERSION,
        run_id=run_id,
        identifiers=identifiers,
        K=cfg.recommend.K,
        max_history=cfg.recommend.max_history,
    )
    spec, num_workers = job_actors(cfg)
    report, start = RecommendReport(), time.perf_counter()
    with (
        RecommendationWriter(store, shard_rows=cfg.output.shard_rows, run_id=run_id) as writer,
        nullcontext(group) if group else WorkerGroup(RecommendWorker, spec, num_workers, cfg.execution.address) as g,
    ):
        for result in g.stream(todo, task, slots=cfg.execution.batch_size, desc="recommend", unit="user"):
            record(result, writer, report)
        writer.flush()
    report.wall_s = time.perf_counter() - start
    recs = read_recommendations(store).filter(pl.col("run_id") == run_id)
    metrics = evaluate(recs, held_out_items(data.split.new_interactions), sorted({1, 5, cfg.recommend.K}))
    summary = RecommendSummary(run_id, str(store), report, metrics)
    Location.of(store.parent / "recommend_eval.json").write_text(
        json.dumps(  # atomic: temp file + rename
            {"run_id": run_id, "decoder": cfg.decoder.name, "K": cfg.recommend.K, **metrics, "report": asdict(report)},
            indent=1,
        )
    )
    return summary


def print_recommend_summary(s: RecommendSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    r = s.report
    t = Table(title=f"laser recommend {s.run_id}")
    for col in ("users", "failed", "target forwards", "beam steps", "steps/forward", "wall s", *s.metrics):
        t.add_column(col, justify="right")
    per = f"{r.beam_steps / r.target_forwards:.2f}" if r.target_forwards else "-"
    t.add_row(
        str(r.done),
        str(r.failed),
        str(r.target_forwards),
        str(r.beam_steps),
        per,
        f"{r.wall_s:.1f}",
        *[f"{v:.4g}" for v in s.metrics.values()],
    )
    Console(width=160).print(t)
    Console(width=160).print(f"recommendations: {s.store}")
