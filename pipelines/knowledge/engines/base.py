"""What the knowledge worker asks of an engine: the :class:`EngineAdapter` protocol and its clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pipelines.knowledge.records import Attempt, DecodeTask, Finished

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pipelines.knowledge.pool_cache import PoolCache


@dataclass(frozen=True)
class EngineClock:
    """An engine's time so far: ``busy_s`` over every step (prefill included), ``decode_s`` and
    ``decode_tokens`` over the steps that only decoded (no request prefilling in them) and the tokens they
    gave. Every engine measures the same thing: decode throughput with no prefill in it."""

    busy_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0

    def __add__(self, other: EngineClock) -> EngineClock:
        return EngineClock(
            self.busy_s + other.busy_s, self.decode_s + other.decode_s, self.decode_tokens + other.decode_tokens
        )

    def __sub__(self, since: EngineClock) -> EngineClock:
        return EngineClock(
            self.busy_s - since.busy_s, self.decode_s - since.decode_s, self.decode_tokens - since.decode_tokens
        )


class EngineAdapter(Protocol):
    """One engine as the knowledge worker drives it, pull-style (one adapter per worker actor).

    Built from the actor's :class:`~pipelines.workers.ModelSpec`, it loads what its engine needs
    (``tokenizer`` is the model's; ``model_name`` goes in the rows' ``model`` column, ``name`` in their
    ``engine`` column). The worker starts it, submits attempts (a bad one raises, and fails alone), steps
    it until what it submitted has come back, and aborts what a failed step left.
    """

    name: str
    tokenizer: PreTrainedTokenizerBase
    model_name: str

    def start(self, slots: int, task: DecodeTask | None = None, pools: PoolCache | None = None) -> dict[str, object]:
        """Start the engine for ``slots`` attempts in flight (once; what it did, for the log) and, given a
        ``task``, ready it for that pass, drafting from ``pools``."""
        ...

    def submit(self, attempt: Attempt) -> None:
        """Hand one attempt to the engine; it decodes in the steps that follow."""
        ...

    def step(self) -> list[Finished]:
        """Run the engine one step: the attempts that finished in it."""
        ...

    def abort(self) -> None:
        """Drop every attempt the engine holds."""
        ...

    def clock(self) -> EngineClock:
        """The engine's time so far."""
        ...
