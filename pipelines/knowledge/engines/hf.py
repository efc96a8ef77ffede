"""This package's tree-attention engine (``execution.engine: hf``) behind the worker's adapter protocol.

The adapter loads the model once and builds decoders on it (one engine per decoder). An attempt under
another decoder than the pass's (a greedy retry of a relaxed pass) joins the pass's engine as an exact
request when that engine can verify it greedily, else it is decoded alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from laser.earlier import with_earlier
from pipelines.knowledge.engines.base import Admit, EngineClock
from pipelines.knowledge.records import Attempt, Decoded, DecodeTask, Params
from pipelines.knowledge.retry import task_rules
from pipelines.workers import DecoderCache, ModelSpec

if TYPE_CHECKING:
    from laser.decoders.base import Decoder
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
        self.held: dict[int, Attempt] = {}  # engine request id -> attempt
        self.fresh: list[Request] = []  # requests made since the engine last admitted

    def ready(self, slots: int) -> dict[str, object]:
        return {}

    def start(self, task: DecodeTask, slots: int, pools: PoolCache) -> None:
        from laser.engine import TREE_ROOM

        self.task, self.pools = task, pools
        self.pass_decoder = self.decoders.get(task.decoder, task.decoder_params)[0]
        self.capacity = (task.max_prompt_tokens or self.lm.context_length) + task.max_new_tokens + TREE_ROOM

    def clock(self) -> EngineClock:
        logs = [dec.engine.log for dec in self.used]
        return EngineClock(
            sum(g.prefill_s + g.decode_s for g in logs),
            sum(g.decode_s for g in logs),
            sum(g.decode_tokens for g in logs),
        )

    def joins(self, attempt: Attempt) -> bool:
        # the pass's own decoder, or its greedy form as exact rows (a relaxed LASER pass's greedy retries)
        dec = self.decoders.get(attempt.decoder, attempt.params)[0]
        return dec is self.pass_decoder or (attempt.sampling.greedy and self.pass_decoder.runs_greedy_of(dec))

    def make(self, attempt: Attempt) -> None:
        exact = self.decoders.get(attempt.decoder, attempt.params)[0] is not self.pass_decoder  # joins() said so
        r = self._request(self.pass_decoder, attempt, exact)
        self.held[id(r)] = attempt
        self.fresh.append(r)

    def stream(self, admit: Admit, slots: int) -> Iterator[tuple[Attempt, Decoded]]:
        dec = self.pass_decoder

        def feed(n: int) -> list[Request]:
            admit(n)
            made, self.fresh = self.fresh, []
            return made

        for r in dec.engine.stream(feed, slots, self.capacity):
            yield self.held.pop(id(r)), dec.result(r)

    def alone(self, attempt: Attempt) -> Decoded:
        dec = self.decoders.get(attempt.decoder, attempt.params)[0]
        r = self._request(dec, attempt)
        dec.engine.run([r])
        return dec.result(r)

    def abort(self) -> None:
        self.held.clear()
        self.fresh.clear()

    @property
    def in_flight(self) -> int:
        return len(self.held)

    def params_json(self, decoder: str, params: Params) -> str:
        return self.decoders.get(decoder, params)[1]

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
