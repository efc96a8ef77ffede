"""Recommendation on the generation actors: :class:`RecommendWorker` is a
:class:`~pipelines.knowledge.generation.GenerationWorker` (same model loading and decoder cache) with a
``recommend`` method; :class:`RecommendGroup` drives it on Ray with the same scheduler and streams each
user's K rows into a :class:`~pipelines.recommend.store.RecommendationWriter`."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from pipelines.knowledge.generation import (BatchScheduler, DecodeTask, GenerationRequest, GenerationWorker, WorkerGroup,
                                  make_batches)
from pipelines.interrupts import ray_wait
from pipelines.knowledge_store import utc_now
from pipelines.recommend.items import recommend_prompt
from pipelines.recommend.store import RecommendationWriter

log = logging.getLogger(__name__)


@dataclass
class RecommendTask(DecodeTask):
    """A recommendation pass: the decoder plus the catalogue (item_id -> identifier) and K."""

    identifiers: dict[str, str] = field(default_factory=dict)
    K: int = 10
    max_history: int = 20


@dataclass
class RecommendResult:
    users: list[list[dict[str, Any]]] = field(default_factory=list)  # one list of K rows per user
    failures: list[dict[str, str]] = field(default_factory=list)
    decode_s: float = 0.0


class RecommendWorker(GenerationWorker):
    """A generation actor that also ranks items; builds the item trie once per catalogue."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self._tries: dict[int, Any] = {}

    def trie(self, task: RecommendTask) -> Any:
        from laser.decoders.beam.search import ItemTrie

        key = hash(tuple(sorted(task.identifiers.items())))
        if key not in self._tries:
            tok, eos = self.lm.tokenizer, sorted(self.lm.eos_ids)
            if tok is None or not eos:
                raise ValueError(f"model {self.lm.name!r} needs a tokenizer and an end-of-sequence token to name items")
            ids = {item: tok.encode(text, add_special_tokens=False) for item, text in task.identifiers.items()}
            self._tries = {key: ItemTrie(ids, end_token=eos[0])}
        return self._tries[key]

    def recommend(self, task: RecommendTask, requests: list[GenerationRequest]) -> RecommendResult:
        """K ranked rows per user; a user that fails (no history, prompt too long) becomes a failure."""
        out = RecommendResult()
        decoder, params_json = self._decoder(task)
        trie = self.trie(task)
        ready = []
        for req in requests:
            try:
                ready.append((req, recommend_prompt(req.history or [], task.domain, req.entity_id, task.max_history)))
            except Exception as exc:
                out.failures.append({"entity_type": "user", "entity_id": req.entity_id, "reason": f"{type(exc).__name__}: {exc}"})
        if not ready:
            return out
        try:
            recs = decoder.recommend_batch([p for _, p in ready], trie, task.K)
        except Exception as exc:  # one bad user never takes down the batch: retry one by one
            log.warning("batch of %d failed (%s); one by one", len(ready), exc)
            recs = None
        for i, (req, prompt) in enumerate(ready):
            try:
                rec = recs[i] if recs is not None else decoder.recommend(prompt, trie, task.K)
            except Exception as exc:
                out.failures.append({"entity_type": "user", "entity_id": req.entity_id, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            out.users.append(self._rows(task, req, rec, params_json))
        out.decode_s = max((u[0]["decode_s"] for u in out.users), default=0.0)
        return out

    def _rows(self, task: RecommendTask, req: GenerationRequest, rec: Any, params_json: str) -> list[dict[str, Any]]:
        now = utc_now()
        return [{"user_id": req.entity_id, "rank": r, "item_id": item, "score": score, "decoder": task.decoder,
                 "decoder_params": params_json, "run_id": task.run_id, "generated_at": now, "model": self.lm.name,
                 "target_forwards": int(rec.stats.target_forwards), "beam_steps": int(rec.beam_steps),
                 "decode_s": float(rec.stats.prefill_s + rec.stats.decode_s)}
                for r, (item, score) in enumerate(rec.items, 1)]


@dataclass
class RecommendReport:
    done: int = 0
    failed: int = 0
    target_forwards: int = 0
    beam_steps: int = 0
    wall_s: float = 0.0
    decode_s: float = 0.0


class RecommendGroup(WorkerGroup):
    """Recommendation actors; ``recommend`` streams results like :meth:`WorkerGroup.run` does knowledge."""

    worker_cls = RecommendWorker

    def recommend(self, requests: list[GenerationRequest], task: RecommendTask, writer: RecommendationWriter, *,
                  batch_size: int) -> RecommendReport:
        report = RecommendReport()
        if not requests:
            return report
        import ray
        from ray.exceptions import RayActorError

        start = time.perf_counter()
        self._start(min(self.num_workers, len(requests)))
        scheduler = BatchScheduler(make_batches(requests, batch_size))
        task_ref = ray.put(task)  # the catalogue travels once
        in_flight: dict[Any, tuple[int, list[GenerationRequest]]] = {}

        def dispatch(actor: int) -> None:
            batch = scheduler.next_for(actor)
            if batch is not None:
                in_flight[self.actors[actor].recommend.remote(task_ref, batch)] = (actor, batch)

        with tqdm(total=len(requests), desc="recommend", unit="user") as bar:
            for a in range(len(self.actors)):
                dispatch(a)
            while in_flight:
                ready, _ = ray_wait(list(in_flight), num_returns=1, timeout=0.5)
                if not ready:
                    continue
                actor, batch = in_flight.pop(ready[0])
                try:
                    result: RecommendResult = ray.get(ready[0])
                except RayActorError as exc:
                    result = RecommendResult(failures=[{"entity_type": "user", "entity_id": r.entity_id,
                                                        "reason": f"worker died: {exc}"} for r in batch])
                else:
                    dispatch(actor)
                record(result, writer, report)
                bar.update(len(batch))
                if not in_flight and scheduler:
                    raise RuntimeError("all recommendation actors died")
        writer.flush()
        report.wall_s = time.perf_counter() - start
        return report


def record(result: RecommendResult, writer: RecommendationWriter, report: RecommendReport) -> None:
    for rows in result.users:
        writer.add_rows(rows)
        report.target_forwards += rows[0]["target_forwards"]
        report.beam_steps += rows[0]["beam_steps"]
    for f in result.failures:
        writer.add_failure("user", f["entity_id"], f["reason"])
    report.done += len(result.users)
    report.failed += len(result.failures)
    report.decode_s += result.decode_s
