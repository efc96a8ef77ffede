"""What the knowledge worker asks of an engine: the :class:`EngineAdapter` protocol and its clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from pipelines.knowledge.records import Attempt, Decoded, DecodeTask, Params

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


Admit = Callable[[int], int]
"""The worker's admission: hand the adapter up to ``n`` more attempts (through ``make``); returns how many."""


class EngineAdapter(Protocol):
    """One engine as the worker's serve skeleton drives it (one adapter per worker actor).

    An adapter is built from the actor's :class:`~pipelines.workers.ModelSpec` and loads what its engine
    needs (``tokenizer`` is the model's; ``model_name`` goes in the rows' ``model`` column). ``start``
    readies it for a pass; ``make`` hands it one attempt (raising for a bad one, which then fails alone);
    ``stream`` runs the engine while ``admit(n)`` gives it work, yielding ``(attempt, decoded)`` as each
    finishes; ``alone`` decodes one attempt by itself; ``abort`` drops what a failed engine held.
    """

    name: str  # the ``engine`` column of the rows it decodes
    tokenizer: PreTrainedTokenizerBase
    model_name: str

    def ready(self, slots: int) -> dict[str, object]:
        """Build what the engine needs before its first request; what it did, for the log."""
        ...

    def start(self, task: DecodeTask, slots: int, pools: PoolCache) -> None:
        """Ready the engine for a pass of ``task`` with ``slots`` attempts in flight, drafting from ``pools``."""
        ...

    def clock(self) -> EngineClock:
        """The engine's time so far."""
        ...

    def joins(self, attempt: Attempt) -> bool:
        """Whether ``attempt`` can share the pass's engine (else the worker decodes it alone)."""
        ...

    def make(self, attempt: Attempt) -> None:
        """Hand one attempt to the engine."""
        ...

    def stream(self, admit: Admit, slots: int) -> Iterator[tuple[Attempt, Decoded]]:
        """Run the engine until it holds nothing and ``admit`` gives nothing more."""
        ...

    def alone(self, attempt: Attempt) -> Decoded:
        """Decode one attempt by itself (nothing else in flight)."""
        ...

    def abort(self) -> None:
        """Drop every attempt the engine holds."""
        ...

    @property
    def in_flight(self) -> int:
        """Attempts handed to the engine and not yet finished."""
        ...

    def params_json(self, decoder: str, params: Params) -> str:
        """The decoder parameters a row records (JSON, keys sorted)."""
        ...
