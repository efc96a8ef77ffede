"""Knowledge generation: the worker actor that writes knowledge, its task, and the pass's report.

A :class:`GenerationWorker` runs the continuous engine: up to ``slots`` requests decode together (rows of
different pools share a batch, each drafting from its own pool, loaded through an LRU), a finished request
leaves at once and a waiting one takes its slot. The one driver (:mod:`pipelines.workers.driver`) feeds
it; :func:`record_result` writes what comes back into a
:class:`~pipelines.store.knowledge.KnowledgeWriter`. A request that fails (prompt too long, bad item,
decoder error) becomes a failure record; it never takes down the others.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable, Iterator

from laser.sampling import GREEDY
from pipelines.store.knowledge import KnowledgeRow, KnowledgeWriter
from pipelines.knowledge.prompts import entity_input, words_for_budget
from pipelines.quality import QualitySummary, entity_quality, row_quality, words_per_token
from pipelines.knowledge.engines import build_adapter
from pipelines.knowledge.engines.base import EngineClock
from pipelines.knowledge.pool_cache import PoolCache
from pipelines.knowledge.records import Attempt, DecodeTask, Finished
from pipelines.knowledge.retry import LOOP_POLICIES, GenreBan, LoopStop, first_rules, retry_plan, retry_reasons, worse
from pipelines.knowledge.sampling import encode_sampling, entity_sampling
from pipelines.knowledge.time_account import EngineTime
from pipelines.workers import Failure, GenerationRequest, ModelSpec, StreamWorker, WorkerDead, WorkResult

log = logging.getLogger(__name__)

ALONE_STEPS = 8  # engine steps per token an attempt decoded alone may take before it is failed (a lost attempt)


@dataclass
class BatchResult(WorkResult[KnowledgeRow]):
    """Knowledge rows (knowledge schema) and failures of finished requests; ``discarded``: the rows of
    attempts decoded and not written (of a retried entity, the text that read worse), which the pass's
    report counts as work done."""

    rows: list[KnowledgeRow] = field(default_factory=list)
    discarded: list[KnowledgeRow] = field(default_factory=list)
    busy_s: float = 0.0  # the engine's seconds for them, every step (prefill included)
    decode_tokens: int = 0  # tokens of the steps that only decoded (``decode_s``: their seconds)

    def row_key(self, row: KnowledgeRow) -> tuple[str, str]:
        return row.entity_type, row.entity_id

    def merge(self, other: WorkResult[KnowledgeRow]) -> None:
        super().merge(other)
        self.discarded += getattr(other, "discarded", [])
        self.busy_s += getattr(other, "busy_s", 0.0)
        self.decode_tokens += getattr(other, "decode_tokens", 0)


@dataclass
class _Stream:
    """One serve stream's state: its pass, where its requests come from, the attempts the engine holds (by
    id), failures not yet yielded, and the engine's clock at the last result yielded."""

    task: DecodeTask
    take: Callable[[int], list[GenerationRequest]]
    spent: EngineClock
    held: dict[int, Attempt] = field(default_factory=dict)
    failed: list[Failure] = field(default_factory=list)


class GenerationWorker(StreamWorker[DecodeTask, KnowledgeRow]):
    """A worker actor that writes knowledge: the serve skeleton (admission, the degenerate-text policy and
    its retries, failure handling, accounting) over the engine adapter of ``spec.engine``
    (:mod:`pipelines.knowledge.engines`). The same actor serves every pass of a job (old knowledge, new
    knowledge, retries), so its engine starts once."""

    def result(self, failures: list[Failure] | None = None) -> BatchResult:
        return BatchResult(failures=failures or [])

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.adapter = build_adapter(spec)
        self.tokenizer = self.adapter.tokenizer
        self.pools = PoolCache(self.tokenizer)

    def ready(self, slots: int) -> dict[str, object]:
        """Start the engine now (it would start on the first pass): what the start did, for the log."""
        t0 = time.perf_counter()
        info = self.adapter.start(slots)
        return {"model": self.spec.model, **info, "ready_s": round(time.perf_counter() - t0, 1)}

    def prompt(self, task: DecodeTask, req: GenerationRequest) -> str | list[int]:
        """The chat message for ``req``, or its token ids with a system prompt (:func:`entity_input`)."""
        return entity_input(task, req, self.tokenizer)

    def first_attempt(self, task: DecodeTask, req: GenerationRequest) -> Attempt:
        return Attempt(
            req,
            self.prompt(task, req),
            task.decoder,
            task.decoder_params,
            req.pool_key if self.pools.has(task, req.pool_key) else None,
            entity_sampling(task.sampling, req.entity_type, req.entity_id),
            first_rules(task, req, self.genre_ban),
            earlier=self.earlier_ids(req),
            stop=self.loop_stop(task),
        )

    def earlier_ids(self, req: GenerationRequest) -> list[int] | None:
        """The entity's earlier knowledge as the model's tokens (as pools hold texts), or None."""
        if not req.earlier:
            return None
        return list(self.tokenizer(req.earlier, add_special_tokens=False)["input_ids"])

    def loop_stop(self, task: DecodeTask) -> Callable[[], LoopStop] | None:
        """The stop check of a first text: under a policy that acts on degenerate rows it stops once it is
        surely degenerate (:class:`pipelines.knowledge.retry.LoopStop`); None under the others."""
        if task.degenerate not in LOOP_POLICIES:
            return None
        tokenizer = self.tokenizer

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        return partial(LoopStop, decode, task.max_new_tokens, self.words_per_token)

    @cached_property
    def genre_ban(self) -> GenreBan:
        """Genre bans in this model's tokens (:class:`pipelines.knowledge.retry.GenreBan`)."""
        return GenreBan(self.tokenizer)

    @cached_property
    def words_per_token(self) -> int:
        """The most words one token of the model's vocabulary adds (read once, at the first stop check)."""
        return words_per_token(self.tokenizer)

    def serve(
        self, task: DecodeTask, take: Callable[[int], list[GenerationRequest]], slots: int
    ) -> Iterator[BatchResult]:
        """Decode requests pulled from ``take(n)`` through the engine; yield each one's result as it finishes.

        Retries of flawed rows join the engine as ordinary requests (first in line). A request whose prompt
        or pool cannot be made fails alone. If the engine fails mid-stream, the attempts it held are decoded
        one by one (so a bad entity fails by itself) and the stream goes on. An engine that declares the
        worker dead (:class:`~pipelines.workers.WorkerDead`) ends the stream: the driver re-sends its work.
        """
        self.task = task
        self.adapter.start(slots, task, self.pools)
        self.retries: deque[Attempt] = deque()
        st = _Stream(task, take, self.adapter.clock())
        while True:
            self._admit(st, slots - len(st.held))
            if not st.held:
                break
            try:
                finished = self.adapter.step()
            except WorkerDead:
                raise
            except Exception as exc:
                yield from self._one_by_one(st, exc)
                continue
            for fin in finished:
                st.held.pop(id(fin.attempt), None)
                part = self._finish(fin)
                if part is not None or st.failed:
                    yield self._settle(st, part or BatchResult())
        if st.failed:  # retries never remain: the loop admits the queued ones first and runs until none is left
            yield self._settle(st, BatchResult())

    def _admit(self, st: _Stream, n: int) -> int:
        """Hand up to ``n`` attempts to the engine, queued retries first; how many it took. A request whose
        attempt cannot be made becomes a failure of ``st``."""
        made = 0
        while made < n:
            todo: list[Attempt | GenerationRequest] = [
                self.retries.popleft() for _ in range(min(n - made, len(self.retries)))
            ]
            todo = todo or list(st.take(n - made))
            if not todo:
                break
            for item in todo:
                try:  # one bad entity never takes down the others
                    attempt = item if isinstance(item, Attempt) else self.first_attempt(st.task, item)
                    self.adapter.submit(attempt)
                    st.held[id(attempt)] = attempt
                    made += 1
                except WorkerDead:
                    raise
                except Exception as exc:
                    st.failed.append(_failure(item.req if isinstance(item, Attempt) else item, exc))
        return made

    def _settle(self, st: _Stream, part: BatchResult) -> BatchResult:
        """``part`` with the engine time since the last one (shared steps once, retries decoded alone too)
        and the failures not yet yielded (first)."""
        now = self.adapter.clock()
        took, st.spent = now - st.spent, now
        part.busy_s += took.busy_s
        part.decode_s += took.decode_s
        part.decode_tokens += took.decode_tokens
        part.failures[:0], st.failed[:] = st.failed, []
        return part

    def _one_by_one(self, st: _Stream, exc: Exception) -> Iterator[BatchResult]:
        """After the engine failed mid-stream: the attempts it held, decoded one by one."""
        log.warning("decoding %d requests together failed (%s); decoding them one by one", len(st.held), exc)
        self.adapter.abort()
        stranded = list(st.held.values())
        st.held.clear()
        for attempt in stranded:
            yield self._settle(st, self._alone(attempt))

    def _alone(self, attempt: Attempt) -> BatchResult:
        """``attempt`` decoded with nothing else in flight (after a failed step); a failure of its own."""
        try:
            self.adapter.submit(attempt)
            for _ in range(ALONE_STEPS * (self.task.max_new_tokens + 1)):
                fin = next((f for f in self.adapter.step() if f.attempt is attempt), None)
                if fin is not None:
                    break
            else:
                raise RuntimeError("the engine never finished it")
        except WorkerDead:
            raise
        except Exception as exc:
            self.adapter.abort()
            return BatchResult(failures=[_failure(attempt.req, exc)])
        return self._finish(fin, alone=True) or BatchResult()

    def _finish(self, fin: Finished, alone: bool = False) -> BatchResult | None:
        """The row of one finished attempt after the degenerate-text policy, its failure, or None when
        its retry was queued (the row comes when the retry finishes)."""
        attempt = fin.attempt
        try:
            row = self._row(fin)
            if attempt.first is not None:  # a retry finished: the better of the two
                first = attempt.first
                kept, dropped = (first, row) if attempt.compare and worse(row, first) else (row, first)
                return self._written(attempt, BatchResult(rows=[kept], discarded=[dropped]))
            plan = retry_plan(self.task, attempt.req, row, self.genre_ban)
        except Exception as exc:  # a verdict on a decoded text: the engine worked (the driver's FirstFailures)
            return BatchResult(failures=[_failure(attempt.req, exc, decoded=True)])
        if plan is None:
            return self._written(attempt, BatchResult(rows=[row]))
        retry = Attempt(
            attempt.req,
            attempt.prompt,
            plan.decoder,
            plan.params,
            attempt.pool_key if plan.keep_pool else None,
            GREEDY,
            plan.rules,
            first=row,
            compare=plan.compare,
            earlier=attempt.earlier if plan.keep_pool else None,
        )
        if alone:
            return self._alone(retry)
        self.retries.append(retry)
        return None

    def _written(self, attempt: Attempt, part: BatchResult) -> BatchResult:
        """``part``, whose row the worker writes: its text joins its group's pool where that grows here."""
        for row in part.rows:
            self.pools.grow(self.task, attempt.req.pool_key, row.knowledge)
        return part

    def _row(self, fin: Finished) -> KnowledgeRow:
        a, res = fin.attempt, fin.decoded
        st, req, task = res.stats, a.req, self.task
        q = entity_quality(
            res.text,
            st.finish_reason,
            req.entity_type,
            req.history,
            req.item,
            words_for_budget(task.max_new_tokens),
            task.brands,
        )
        pooled = a.pool_key is not None
        g = q.grounding
        return KnowledgeRow(
            entity_type=req.entity_type,
            entity_id=req.entity_id,
            knowledge=res.text,
            model=self.adapter.model_name,
            decoder=a.decoder,
            decoder_params=fin.decoder_params,
            prompt_version=task.prompt_version,
            pool_kind=req.pool_kind if pooled else None,
            group_id=req.group_id if pooled else None,
            n_tokens=len(res.token_ids),
            target_forwards=int(st.target_forwards),
            accepted_tokens=int(sum(st.accepted_per_step)),
            retrieval_s=float(st.retrieval_s),
            generation_s=float(st.prefill_s + st.decode_s),
            finish_reason=st.finish_reason,
            run_id=task.run_id,
            finished_eos=q.finished_eos,
            repeat_4gram=q.repeat_4gram,
            degenerate=q.degenerate,
            ended=q.ended,
            cut=q.cut,
            fragment=q.fragment,
            n_words=q.n_words,
            asked_words=q.asked_words,
            facts_mentioned=g.n_mentioned if g is not None else None,
            grounding=g.share if g is not None else None,
            greedy_retry=a.first is not None,
            prefill_s=float(st.prefill_s),
            decode_s=float(st.decode_s),
            source_hash=req.source_hash,
            sampling=encode_sampling(a.sampling),
            engine=self.adapter.name,
            prompt_tokens=st.prompt_tokens,
            cached_prompt_tokens=st.cached_prompt_tokens,
            config_hash=task.config_hash,
            own_accepted_tokens=st.own_accepted,
        )


def _failure(req: GenerationRequest, exc: Exception, decoded: bool = False) -> Failure:
    log.warning("%s %s failed: %s", req.entity_type, req.entity_id, exc)
    return Failure.of(req, exc, decoded)


@dataclass
class GenerationReport:
    """What one generation pass did (for the closing summary)."""

    done: int = 0
    failed: int = 0
    n_tokens: int = 0  # generated tokens of the rows written
    target_forwards: int = 0
    accepted_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0  # summed over rows
    # every attempt decoded, written or not (a retried entity decodes twice): the engine's work
    retries: int = 0  # retries decoded (kept or not)
    decoded_tokens: int = 0
    decoded_forwards: int = 0
    decoded_accepted: int = 0
    prompt_tokens: int = 0  # summed over the attempts that counted them
    cached_prompt_tokens: int = 0  # of them, served from the engine's prefix cache
    own_accepted: int = 0  # accepted draft tokens taken from the entity's own earlier text (where counted)
    busy_s: float = 0.0  # actors' engine seconds, every step (prefill included), a shared step once
    decode_s: float = 0.0  # of them, the steps that only decoded
    decode_tokens: int = 0  # the tokens those steps gave
    greedy_retries: int = 0  # rows written by their retry
    retry_reasons: dict[str, int] = field(default_factory=dict)  # flaws of the retried first texts
    retry_tokens: int = 0  # decoded tokens of the retries (kept or not)
    retry_kept: dict[str, int] = field(default_factory=dict)  # per flaw: retries that were written (they paid)
    retry_cost: dict[str, int] = field(default_factory=dict)  # per flaw: tokens its retries decoded
    startup_s: float = 0.0  # the driver blocked on the workers' start (Ray, actors, model, engine)
    write_s: float = 0.0  # the driver writing rows and failures
    actors: int = 1  # actors that worked side by side
    quality: QualitySummary = field(default_factory=QualitySummary)

    @property
    def aal(self) -> float:
        """Tokens per decoding forward over every attempt: (accepted draft tokens + forwards) / forwards."""
        f = self.decoded_forwards
        return (self.decoded_accepted + f) / f if f else 0.0

    def engine_time(self) -> EngineTime:
        """The pass's figures a run's :class:`~pipelines.knowledge.time_account.TimeAccount` splits."""
        return EngineTime(
            wall_s=self.wall_s,
            startup_s=self.startup_s,
            writing_s=self.write_s,
            busy_s=self.busy_s,
            decode_s=self.decode_s,
            retry_share=self.retry_tokens / self.decoded_tokens if self.decoded_tokens else 0.0,
            actors=self.actors,
        )

    @property
    def tokens_per_s(self) -> float:
        """Wall throughput: generated tokens / seconds of the pass, which includes actor start-up and model
        load, pool loads, prompt building, prefill, decoding and writing."""
        return self.n_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def engine_tokens_per_s(self) -> float:
        """Engine throughput: tokens of every attempt / actor engine seconds (every step, prefill included;
        model and pool loads excluded). Actors run in parallel, so wall throughput can exceed it."""
        return self.decoded_tokens / self.busy_s if self.busy_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode throughput: tokens / seconds of the engine steps in which no request prefilled (on hf the
        decoding steps; on vLLM the steps LASER's proposer timed with no prompt in them), so a pass with
        longer prompts is not charged for their prefill."""
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0


def record_result(result: WorkResult[KnowledgeRow], writer: KnowledgeWriter, report: GenerationReport) -> None:
    """Write one result's rows and failures (a knowledge worker's :class:`BatchResult`) and count them into
    ``report``."""
    if not isinstance(result, BatchResult):
        raise TypeError(f"a knowledge worker yields BatchResult, not {type(result).__name__}")
    for row in result.rows:
        writer.add(row)
        report.n_tokens += row.n_tokens
        report.target_forwards += row.target_forwards
        report.accepted_tokens += row.accepted_tokens
        report.prefill_s += row.prefill_s or 0.0
        report.greedy_retries += bool(row.greedy_retry)
        report.quality.add(row_quality(row.as_dict()))
    report.retries += len(result.discarded)  # each retry leaves one text unwritten
    written = {result.row_key(r): r for r in result.rows}
    for d in result.discarded:  # the first text is the unwritten one, or the one its retry lost to
        kept = written.get(result.row_key(d))
        first = d if not d.greedy_retry else (kept or d)
        retry = d if d.greedy_retry else kept
        for reason in retry_reasons(first):
            report.retry_reasons[reason] = report.retry_reasons.get(reason, 0) + 1
            report.retry_cost[reason] = report.retry_cost.get(reason, 0) + (retry.n_tokens if retry else 0)
            if kept is not None and kept.greedy_retry:
                report.retry_kept[reason] = report.retry_kept.get(reason, 0) + 1
    for row in [*result.rows, *result.discarded]:
        report.decoded_tokens += row.n_tokens
        report.retry_tokens += row.n_tokens if row.greedy_retry else 0
        report.decoded_forwards += row.target_forwards
        report.decoded_accepted += row.accepted_tokens
        report.prompt_tokens += row.prompt_tokens or 0
        report.cached_prompt_tokens += row.cached_prompt_tokens or 0
        report.own_accepted += row.own_accepted_tokens or 0
    report.busy_s += result.busy_s
    report.decode_s += result.decode_s
    report.decode_tokens += result.decode_tokens
    for f in result.failures:
        writer.add_failure(f.entity_type, f.entity_id, f.reason)
    report.done += len(result.rows)
    report.failed += len(result.failures)
