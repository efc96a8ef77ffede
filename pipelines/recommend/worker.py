"""Recommendation on the shared worker actors: :class:`RecommendWorker` ranks the catalogue for batches of
users (the beam decoders), the one driver (:mod:`pipelines.workers.driver`) feeds it, and :func:`record`
writes each user's K rows into a :class:`~pipelines.recommend.store.RecommendationWriter`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

from pipelines.store.shards import utc_now
from pipelines.recommend.items import recommend_prompt
from pipelines.recommend.store import RecommendationWriter
from pipelines.workers import Failure, GenerationRequest, ModelSpec, ModelWorker, WorkResult

if TYPE_CHECKING:
    from laser.decoders.base import Prompt
    from laser.decoders.beam.decoders import Recommendation
    from laser.decoders.beam.search import ItemTrie

log = logging.getLogger(__name__)


@runtime_checkable
class Ranker(Protocol):
    """What a ranking decoder (``produces = "ranking"``: beam, atspeed) offers the worker."""

    def recommend_batch(self, prompts: Sequence[Prompt], trie: ItemTrie, K: int) -> list[Recommendation]: ...

    def recommend(self, prompt: Prompt, trie: ItemTrie, K: int) -> Recommendation: ...


@dataclass
class RecommendTask:
    """A recommendation pass: the decoder, the catalogue (item_id -> identifier) and K."""

    decoder: str
    decoder_params: dict[str, Any] = field(default_factory=dict)
    domain: str = "movie"
    prompt_version: str = ""
    run_id: str = ""
    identifiers: dict[str, str] = field(default_factory=dict)
    K: int = 10
    max_history: int = 20


@dataclass
class UserRanking:
    """One user's K ranked rows (recommendation schema)."""

    user_id: str
    rows: list[dict[str, Any]]


class RecommendResult(WorkResult[UserRanking]):
    """Rankings (:class:`UserRanking`) and failures of finished users."""

    def row_key(self, row: UserRanking) -> tuple[str, str]:
        return "user", row.user_id


class RecommendWorker(ModelWorker[RecommendTask, UserRanking]):
    """A worker actor that ranks items; builds the item trie once per catalogue."""

    def result(self, failures: list[Failure] | None = None) -> RecommendResult:
        return RecommendResult(failures=failures or [])

    def __init__(self, spec: ModelSpec) -> None:
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

    def serve(
        self, task: RecommendTask, take: Callable[[int], list[GenerationRequest]], slots: int
    ) -> Iterator[RecommendResult]:
        """Rank ``slots`` users at a time, a result per batch."""
        while batch := take(slots):
            yield self.recommend(task, batch)

    def recommend(self, task: RecommendTask, requests: list[GenerationRequest]) -> RecommendResult:
        """K ranked rows per user; a user that fails (no history, prompt too long) becomes a failure."""
        out = RecommendResult()
        decoder, params_json = self.decoder(task.decoder, task.decoder_params)
        if not isinstance(decoder, Ranker):  # the job resolved it with produces="ranking"
            raise TypeError(f"decoder {task.decoder!r} ranks no items (it has no recommend_batch)")
        trie = self.trie(task)
        ready = []
        for req in requests:
            try:
                ready.append((req, recommend_prompt(req.history or [], task.domain, req.entity_id, task.max_history)))
            except Exception as exc:
                out.failures.append(_failure(req, exc))
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
                out.failures.append(_failure(req, exc))
                continue
            out.rows.append(UserRanking(req.entity_id, self._rows(task, req, rec, params_json)))
        out.decode_s = max((u.rows[0]["decode_s"] for u in out.rows if u.rows), default=0.0)
        return out

    def _rows(self, task: RecommendTask, req: GenerationRequest, rec: Any, params_json: str) -> list[dict[str, Any]]:
        now = utc_now()
        return [
            {
                "user_id": req.entity_id,
                "rank": r,
                "item_id": item,
                "score": score,
                "decoder": task.decoder,
                "decoder_params": params_json,
                "run_id": task.run_id,
                "generated_at": now,
                "model": self.lm.name,
                "target_forwards": int(rec.stats.target_forwards),
                "beam_steps": int(rec.beam_steps),
                "decode_s": float(rec.stats.prefill_s + rec.stats.decode_s),
            }
            for r, (item, score) in enumerate(rec.items, 1)
        ]


def _failure(req: GenerationRequest, exc: Exception) -> Failure:
    return Failure("user", req.entity_id, f"{type(exc).__name__}: {exc}")


@dataclass
class RecommendReport:
    done: int = 0
    failed: int = 0
    target_forwards: int = 0
    beam_steps: int = 0
    wall_s: float = 0.0
    decode_s: float = 0.0


def record(result: WorkResult[UserRanking], writer: RecommendationWriter, report: RecommendReport) -> None:
    """Write one result's rankings and failures and count them into ``report``."""
    for ranking in result.rows:
        writer.add_rows(ranking.rows)
        if ranking.rows:
            report.target_forwards += ranking.rows[0]["target_forwards"]
            report.beam_steps += ranking.rows[0]["beam_steps"]
    for f in result.failures:
        writer.add_failure("user", f.entity_id, f.reason)
    report.done += len(result.rows)
    report.failed += len(result.failures)
    report.decode_s += result.decode_s
