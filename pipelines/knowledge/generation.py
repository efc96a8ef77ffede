"""Knowledge generation: the worker actor that writes knowledge, its task, and the pass's report.

A :class:`GenerationWorker` runs the continuous engine: up to ``slots`` requests decode together (rows of
different pools share a batch, each drafting from its own pool, loaded through an LRU), a finished request
leaves at once and a waiting one takes its slot. The one driver (:mod:`pipelines.workers.driver`) feeds
it; :func:`record_result` writes what comes back into a
:class:`~pipelines.knowledge_store.KnowledgeWriter`. A request that fails (prompt too long, bad item,
decoder error) becomes a failure record; it never takes down the others.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from pipelines.knowledge_store import KnowledgeWriter, utc_now
from pipelines.knowledge.prompts import item_prompt, user_prompt, words_for_budget
from pipelines.quality import (GREEDY_RETRY_DECODER, QualitySummary, entity_quality, quality_columns,
                               row_quality, text_quality)
from pipelines.knowledge.retry import retry_once, task_rules
from pipelines.knowledge.sampling import encode_sampling, entity_sampling
from pipelines.workers import GenerationRequest, ModelSpec, ModelWorker, WorkResult

log = logging.getLogger(__name__)


@dataclass
class DecodeTask:
    """How one generation pass decodes: decoder, limits, prompt domain, pools and provenance (picklable)."""

    decoder: str
    decoder_params: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 256
    max_prompt_tokens: int | None = 1024
    domain: str = "movie"
    prompt_version: str = ""
    run_id: str = ""
    pool_store: str | None = None
    pool_cache_size: int = 8
    degenerate: str = "keep"  # retry | keep | retry_greedy | fail (pipelines/quality.py)
    sampling: dict[str, Any] | None = None  # temperature, top_p, top_k, seed; None = greedy (pipelines/knowledge/sampling.py)
    rules: dict[str, Any] | None = None  # laser.GenerationRules keywords (repetition penalty, stop strings, ...)
    retry_rules: dict[str, Any] | None = None  # the rules of the ``retry`` policy's second attempt


class BatchResult(WorkResult):
    """Knowledge rows (knowledge schema) and failures of finished requests."""


class GenerationWorker(ModelWorker):
    """A worker actor that writes knowledge: pools from an LRU, the continuous engine, the degenerate-text
    policy. The same actor serves every pass of a job (old and new knowledge), so the model loads once."""

    result_cls = BatchResult

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._pools: OrderedDict[str, Any] = OrderedDict()
        self._store: Any = None
        self.pool_loads = 0

    def _pool(self, task: DecodeTask, key: str | None) -> Any:
        """The pool for ``key`` from the LRU, loaded from the task's pool store on a miss (None: no pool)."""
        if key is None:
            return None
        if self._store is None or str(self._store.directory) != str(task.pool_store):
            if task.pool_store is None:
                raise ValueError(f"request needs pool {key!r} but the task has no pool store")
            from pools.store import PoolStore

            self._store = PoolStore.open(task.pool_store, tokenizer=self.lm.tokenizer)
            self._pools.clear()
        if key in self._pools:
            self._pools.move_to_end(key)
            return self._pools[key]
        if key not in self._store:  # a group without old knowledge has no pool: decode without drafts
            return None
        pool = self._store.get(key)
        self.pool_loads += 1
        self._pools[key] = pool
        while len(self._pools) > task.pool_cache_size:
            evicted, _ = self._pools.popitem(last=False)
            self._store.release(evicted)
        return pool

    def prompt(self, task: DecodeTask, req: GenerationRequest) -> str:
        """The chat message for ``req`` (user histories truncated to ``max_prompt_tokens``)."""
        words = words_for_budget(task.max_new_tokens)
        if req.entity_type == "user":
            return user_prompt(req.history or [], task.domain, user_id=req.entity_id,
                               tokenizer=self.lm.tokenizer, max_prompt_tokens=task.max_prompt_tokens, max_words=words)
        if req.entity_type == "item":
            return item_prompt(req.item or {"item_id": req.entity_id}, task.domain, max_words=words)
        raise ValueError(f"unknown entity_type {req.entity_type!r}")

    def _row(self, task: DecodeTask, req: GenerationRequest, pool: Any, res: Any, params_json: str,
             sampling: Any = None) -> dict[str, Any]:
        st = res.stats
        sampling = sampling or entity_sampling(task.sampling, req.entity_type, req.entity_id)
        q = entity_quality(res.text, st.finish_reason, req.entity_type, req.history, req.item,
                           words_for_budget(task.max_new_tokens))
        return {
            "entity_type": req.entity_type, "entity_id": req.entity_id, "knowledge": res.text,
            "model": self.lm.name, "decoder": task.decoder, "decoder_params": params_json,
            "prompt_version": task.prompt_version, "pool_kind": req.pool_kind if pool is not None else None,
            "group_id": req.group_id if pool is not None else None, "n_tokens": len(res.token_ids),
            "target_forwards": int(st.target_forwards), "accepted_tokens": int(sum(st.accepted_per_step)),
            "retrieval_s": float(st.retrieval_s), "generation_s": float(st.prefill_s + st.decode_s),
            "finish_reason": st.finish_reason, "run_id": task.run_id, "generated_at": utc_now(),
            **quality_columns(q), "greedy_retry": False, "prefill_s": float(st.prefill_s), "decode_s": float(st.decode_s),
            "source_hash": req.source_hash, "sampling": encode_sampling(sampling),
        }

    def _apply_policy(self, task: DecodeTask, req: GenerationRequest, prompt: str,
                      row: dict[str, Any]) -> dict[str, Any]:
        """Apply ``task.degenerate`` to a degenerate row: keep it flagged, regenerate it greedily (kept,
        flagged, when still degenerate), or raise so that it becomes a failure."""
        if task.degenerate == "retry":
            return retry_once(self, task, req, prompt, row)
        if not row["degenerate"] or task.degenerate == "keep":
            return row
        reason = text_quality(row["knowledge"], row["finish_reason"]).reason()
        if task.degenerate == "fail":
            raise DegenerateTextError(reason)
        log.info("%s %s: %s; regenerating with %s", req.entity_type, req.entity_id, reason, GREEDY_RETRY_DECODER)
        greedy = DecodeTask(**{**task.__dict__, "decoder": GREEDY_RETRY_DECODER, "decoder_params": {}, "sampling": None})
        decoder, params_json = self._decoder(greedy)
        res = decoder.generate(prompt, task.max_new_tokens, None, rules=task_rules(task.rules))
        return {**self._row(greedy, req, None, res, params_json), "greedy_retry": True}

    def serve(self, task: DecodeTask, take: Callable[[int], list[GenerationRequest]], slots: int) -> Iterator[BatchResult]:
        """Decode requests pulled from ``take(n)`` through the engine; yield each one's result as it finishes.

        A request whose prompt or pool cannot be made fails alone. If the engine fails mid-stream, the
        requests it held are decoded one by one (so a bad entity fails by itself) and the stream goes on.
        """
        from laser.engine import TREE_ROOM

        decoder, params_json = self._decoder(task)
        held: dict[int, tuple[GenerationRequest, str, Any]] = {}  # engine request id -> what made it
        failed: list[dict[str, str]] = []
        capacity = (task.max_prompt_tokens or self.lm.context_length) + task.max_new_tokens + TREE_ROOM

        def admit(n: int) -> list[Any]:
            made: list[Any] = []
            while len(made) < n:
                got = take(n - len(made))
                if not got:
                    break
                for req in got:
                    try:
                        prompt, pool = self.prompt(task, req), self._pool(task, req.pool_key)
                        r = decoder.request(decoder.encode(prompt), task.max_new_tokens, pool,
                                            sampling=entity_sampling(task.sampling, req.entity_type, req.entity_id),
                                            rules=task_rules(task.rules))
                    except Exception as exc:  # one bad entity never takes down the others
                        failed.append(_failure(req, exc))
                        continue
                    held[id(r)] = (req, prompt, pool)
                    made.append(r)
            return made

        spent = decoder.engine.log.decode_s
        while True:
            try:
                for r in decoder.engine.stream(admit, slots, capacity):
                    req, prompt, pool = held.pop(id(r))
                    part = self._finish(task, req, prompt, pool, decoder.result(r), params_json)
                    part.decode_s += decoder.engine.log.decode_s - spent  # shared steps once, plus any retry
                    spent = decoder.engine.log.decode_s
                    part.failures[:0], failed[:] = failed, []
                    yield part
                break
            except Exception as exc:
                log.warning("decoding %d requests together failed (%s); decoding them one by one", len(held), exc)
                stranded, spent = list(held.values()), decoder.engine.log.decode_s
                held.clear()
                for req, prompt, pool in stranded:
                    yield self._alone(task, decoder, params_json, req, prompt, pool)
        if failed:
            yield BatchResult(failures=failed)

    def _alone(self, task: DecodeTask, decoder: Any, params_json: str, req: GenerationRequest, prompt: str,
               pool: Any) -> BatchResult:
        sampling = entity_sampling(task.sampling, req.entity_type, req.entity_id)
        try:
            res = decoder.generate(prompt, task.max_new_tokens, pool, sampling, rules=task_rules(task.rules))
        except Exception as exc:
            return BatchResult(failures=[_failure(req, exc)])
        out = self._finish(task, req, prompt, pool, res, params_json)
        out.decode_s += res.stats.decode_s
        return out

    def _finish(self, task: DecodeTask, req: GenerationRequest, prompt: str, pool: Any, res: Any,
                params_json: str) -> BatchResult:
        """The row of one finished generation, after the degenerate-text policy (or its failure)."""
        try:
            row = self._apply_policy(task, req, prompt, self._row(task, req, pool, res, params_json))
        except Exception as exc:
            return BatchResult(failures=[_failure(req, exc)])
        return BatchResult(rows=[row], decode_s=row["decode_s"] if row["greedy_retry"] else 0.0)


class DegenerateTextError(ValueError):
    """A generated text is degenerate and the policy sends it to failures."""


def _failure(req: GenerationRequest, exc: Exception) -> dict[str, str]:
    log.warning("%s %s failed: %s", req.entity_type, req.entity_id, exc)
    return {"entity_type": req.entity_type, "entity_id": req.entity_id, "reason": f"{type(exc).__name__}: {exc}"}


@dataclass
class GenerationReport:
    """What one generation pass did (for the closing summary)."""

    done: int = 0
    failed: int = 0
    n_tokens: int = 0
    target_forwards: int = 0
    accepted_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0  # summed over rows
    decode_s: float = 0.0  # actors' decoding seconds, summed over batches (a batch's shared steps once)
    greedy_retries: int = 0
    quality: QualitySummary = field(default_factory=QualitySummary)

    @property
    def aal(self) -> float:
        """Tokens per decoding forward: (accepted draft tokens + forwards) / forwards."""
        return (self.accepted_tokens + self.target_forwards) / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Wall throughput: generated tokens / seconds of the pass, which includes actor start-up and model
        load, pool loads, prompt building, prefill, decoding and writing."""
        return self.n_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode-only throughput: generated tokens / actor decoding seconds (a batch counts its longest row's
        decoding time; prefill, model and pool loads excluded). Actors run in parallel, so wall throughput
        can exceed it when prefill is small."""
        return self.n_tokens / self.decode_s if self.decode_s else 0.0


def record_result(result: WorkResult, writer: KnowledgeWriter, report: GenerationReport) -> None:
    """Write one result's rows and failures and count them into ``report``."""
    for row in result.rows:
        writer.add(row)
        report.n_tokens += row["n_tokens"]
        report.target_forwards += row["target_forwards"]
        report.accepted_tokens += row["accepted_tokens"]
        report.prefill_s += row.get("prefill_s") or 0.0
        report.greedy_retries += bool(row.get("greedy_retry"))
        report.quality.add(row_quality(row))
    report.decode_s += result.decode_s
    for f in result.failures:
        writer.add_failure(f["entity_type"], f["entity_id"], f["reason"])
    report.done += len(result.rows)
    report.failed += len(result.failures)
