"""This package's tree-attention engine (``execution.engine: hf``) behind the worker's adapter protocol.

The adapter loads the model once and builds decoders on it (one engine per decoder). A pass decodes in
one continuous batch of its decoder's engine (:class:`laser.engine.ContinuousBatch`): submitted attempts
wait for a free row, and each step admits them before it runs. An attempt under another decoder than the
pass's (a greedy retry of a relaxed pass) joins that batch as an exact request when the pass's engine can
verify it greedily, else it is decoded alone when submitted.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from laser.earlier import with_earlier
from pipelines.knowledge.engines.base import EngineClock
from pipelines.knowledge.records import Attempt, DecodeTask, Finished
from pipelines.knowledge.retry import task_rules
from pipelines.workers import DecoderCache, ModelSpec

if TYPE_CHECKING:
    from laser.decoders.base import Decoder, Generation
    from laser.engine import ContinuousBatch
    from laser.request import Request
    from pipelines.knowledge.pool_cache import PoolCache


class HfAdapter:
    """The ``hf`` engine: decoders built on the actor's transformers model."""

    name = "hf"

    def __init__(self, spec: ModelSpec) -> None:
        import laser

        lm = laser.load_model(spec.model, device=spec.device, dtype=spec.dtype, **spec.loading())
        if lm.tokenizer is None:
            raise ValueError(f"model {spec.model!r} has no tokenizer: the knowledge job writes prompts as text")
        self.lm, self.tokenizer, self.model_name = lm, lm.tokenizer, lm.name
        self.decoders = DecoderCache(lm)
        self.used: set[Decoder] = set()  # decoders whose engine ran (their logs are the clock)
        self.batch: ContinuousBatch | None = None  # the pass's batch, made at its first step
        self.held: dict[int, tuple[Attempt, str]] = {}  # engine request id -> attempt, its parameters' JSON
        self.waiting: deque[Request] = deque()  # submitted, not yet in the batch
        self.done: list[Finished] = []  # decoded alone, handed back at the next step

    def start(self, slots: int, task: DecodeTask | None = None, pools: PoolCache | None = None) -> dict[str, object]:
        if task is None or pools is None:
            return {}
        from laser.engine import TREE_ROOM

        self.abort()
        self.task, self.pools, self.slots = task, pools, slots
        self.pass_decoder = self.decoders.get(task.decoder, task.decoder_params)[0]
        self.capacity = (task.max_prompt_tokens or self.lm.context_length) + task.max_new_tokens + TREE_ROOM
        return {}

    def clock(self) -> EngineClock:
        logs = [dec.engine.log for dec in self.used]
        return EngineClock(
            sum(g.prefill_s + g.decode_s for g in logs),
            sum(g.decode_s for g in logs),
            sum(g.decode_tokens for g in logs),
        )

    def submit(self, attempt: Attempt) -> None:
        dec, params_json = self.decoders.get(attempt.decoder, attempt.params)
        # the pass's own decoder, or its greedy form as exact rows (a relaxed LASER pass's greedy retries)
        if dec is self.pass_decoder or (attempt.sampling.greedy and self.pass_decoder.runs_greedy_of(dec)):
            r = self._request(self.pass_decoder, attempt, exact=dec is not self.pass_decoder)
            self.held[id(r)] = attempt, params_json
            self.waiting.append(r)
        else:
            self.done.append(Finished(attempt, self._alone(dec, attempt), params_json))

    def step(self) -> list[Finished]:
        finished, self.done = self.done, []
        if self.batch is None:
            self.batch = self.pass_decoder.engine.batch(self.slots, self.capacity)
        batch, dec = self.batch, self.pass_decoder
        batch.add([self.waiting.popleft() for _ in range(min(batch.free, len(self.waiting)))])
        for r in batch.step():
            attempt, params_json = self.held.pop(id(r))
            finished.append(Finished(attempt, dec.result(r), params_json))
        return finished

    def abort(self) -> None:
        self.batch = None
        self.held.clear()
        self.waiting.clear()
        self.done.clear()

    def _alone(self, dec: Decoder, attempt: Attempt) -> Generation:
        """``attempt`` decoded by itself on ``dec``'s own engine (it cannot join the pass's batch)."""
        r = self._request(dec, attempt)
        dec.engine.run([r])
        return dec.result(r)

    def _request(self, dec: Decoder, attempt: Attempt, exact: bool = False) -> Request:
        self.used.add(dec)
        pool = with_earlier(self.pools.get(self.task, attempt.pool_key), attempt.earlier)
        return dec.request(
            dec.encode(attempt.prompt),
            self.task.max_new_tokens,
            pool,
            sampling=attempt.sampling,
            rules=task_rules(attempt.rules),
            halt=attempt.halt(),
            exact=exact,
        )
