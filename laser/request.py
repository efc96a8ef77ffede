"""Per-request decoding state and counters, shared by the engine, the verifiers and the generation rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from laser.drafting import Drafter
from laser.rules import NO_RULES, GenerationRules
from laser.sampling import GREEDY, SamplingParams
from laser.tree import DraftTree

Halt = Callable[[Sequence[int]], "tuple[str, int] | None"]
"""A caller's stop check, run on a request's new tokens after each step: ``(reason, keep)`` ends the
request with its first ``keep`` new tokens and finish reason ``reason``; None lets it go on."""


@dataclass
class DecodeStats:
    """Counters of one generation. Times are wall seconds; in a batch, shared steps count for each member."""

    target_forwards: int = 0  # decoding forwards of the target, prefill excluded
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens accepted per forward
    drafted_per_step: list[int] = field(default_factory=list)  # draft tokens proposed per forward
    new_tokens: int = 0
    prompt_tokens: int | None = None  # the prompt's tokens (None: the engine did not count them)
    cached_prompt_tokens: int | None = None  # of them, served from a prefix cache, not prefilled (None: not counted)
    own_accepted: int | None = None  # of the accepted drafts, those from the entity's earlier text (laser/earlier.py)
    finish_reason: str = ""  # "eos" | "length" | "stop" (a stop string) | "verifier" | what ``Request.halt`` said
    prefill_s: float = 0.0
    decode_s: float = 0.0
    retrieval_s: float = 0.0  # drafting: proposing trees + drafter upkeep
    tree_s: float = 0.0  # laying out trees, masks and positions
    forward_s: float = 0.0
    verify_s: float = 0.0
    cache_s: float = 0.0  # KV compaction

    @property
    def aal(self) -> float:
        """Average acceptance length: tokens per target forward, (accepted + 1) averaged over steps."""
        steps = len(self.accepted_per_step)
        return (sum(self.accepted_per_step) + steps) / steps if steps else 0.0


@dataclass(eq=False)  # requests are compared by identity: two requests with equal contents are distinct
class Request:
    tokens: list[int]  # prompt + generated; the last one is the next root (not yet cached)
    prompt_len: int
    drafter: Drafter
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    rules: GenerationRules = NO_RULES  # repetition penalty, no-repeat n-grams, min new tokens, bad words
    budget: int | None = None  # most draft nodes per step (None: the drafter's own limit)
    state: Any = None  # typed state the drafter and the verifier share (e.g. a BeamState); None: none
    halt: Halt | None = None  # the caller's stop check (:data:`Halt`)
    exact: bool = (
        False  # verified by the target's greedy rule under a relaxed verifier (a greedy row beside relaxed ones)
    )
    cache_len: int = 0  # committed KV entries: the prompt and accepted tokens before the root
    kept: DraftTree | None = None  # tree nodes kept in the cache after them (beam prefixes; see Outcome.keep)
    stats: DecodeStats = field(default_factory=DecodeStats)
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = self.sampling.generator()

    @property
    def kv_len(self) -> int:
        """Valid cache entries of the request: committed ones plus kept tree nodes."""
        return self.cache_len + (len(self.kept) if self.kept is not None else 0)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len :]
