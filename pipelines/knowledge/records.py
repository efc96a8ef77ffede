"""The typed records that cross the seam from the knowledge job to its engines.

A :class:`DecodeTask` says how one generation pass decodes (it travels to every worker actor); an
:class:`Attempt` is one decoding of one entity, built by the worker and handed to its engine adapter
(:mod:`pipelines.knowledge.engines`); a :class:`Decoded` is what the adapter hands back. The knowledge
row the worker then writes is :class:`pipelines.store.knowledge.KnowledgeRow`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from laser.request import DecodeStats, Halt
from laser.sampling import SamplingParams
from pipelines.store.knowledge import KnowledgeRow
from pipelines.workers import GenerationRequest

if TYPE_CHECKING:
    from pipelines.prompts.template import PromptTemplate

Params = Mapping[str, object]
"""A decoder's parameters, or a task's rules (keywords of :class:`laser.GenerationRules`): JSON-like."""


@dataclass
class DecodeTask:
    """How one generation pass decodes: decoder, limits, prompt domain, pools and provenance (picklable)."""

    decoder: str
    decoder_params: dict[str, object] = field(default_factory=dict)
    max_new_tokens: int = 256
    max_prompt_tokens: int | None = 1024
    domain: str = "movie"
    prompt_version: str = ""
    run_id: str = ""
    pool_store: str | None = None
    pool_cache_size: int = 8
    online_pools: bool = False  # a group the store has no pool for drafts from one growing in the worker
    pool_max_size: int = 2000  # texts a pool growing in the worker takes at most (as the store's pools)
    degenerate: str = "keep"  # retry | keep | retry_greedy | fail (pipelines/quality/)
    sampling: dict[str, float] | None = None  # temperature, top_p, top_k, seed; None = greedy (sampling.py)
    rules: dict[str, object] | None = None  # laser.GenerationRules keywords (repetition penalty, stop strings, ...)
    retry_rules: dict[str, object] | None = None  # the rules of the ``retry`` policy's second attempt
    ban_unsupported_genres: bool = False  # first texts (and retries) name no genre the entity's input lacks
    config_hash: str | None = None  # what decides the text besides its inputs (provenance.py)
    prompts: PromptTemplate | None = None  # None: the shipped template of ``domain``; its hash is prompt_version
    brands: tuple[str, ...] = ()  # the catalogue's brands item grounding counts (pipelines.quality.catalogue_brands)


@dataclass(eq=False)  # attempts are told apart by identity
class Attempt:
    """One decoding of one entity: its first, or a retry of a flawed first row (``first`` set).

    ``stop`` makes the engine's per-request stop check (:data:`laser.request.Halt`), a fresh one each time
    the attempt is decoded (a first text under a policy that acts on degenerate rows; None: no check)."""

    req: GenerationRequest
    prompt: str | list[int]  # the message text, or chat-templated token ids (a system prompt: prompts.py)
    decoder: str
    params: Params
    pool_key: str | None  # a pool the store holds or one growing in the worker, else None (no drafting)
    sampling: SamplingParams
    rules: Params | None
    first: KnowledgeRow | None = None  # the first row, when this is its retry
    earlier: list[int] | None = None  # the entity's earlier knowledge in tokens: drafted first (laser/earlier.py)
    compare: bool = True  # a retry replaces the first row only when it does not read worse
    stop: Callable[[], Halt] | None = None

    def halt(self) -> Halt | None:
        """A new stop check for one decoding of this attempt (None: none)."""
        return self.stop() if self.stop is not None else None


class Decoded(Protocol):
    """One finished decoding as an engine adapter returns it: the generated tokens, their text (decoded as
    the ``hf`` engine decodes) and the decoding's counters."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def text(self) -> str: ...

    @property
    def stats(self) -> DecodeStats: ...


@dataclass(frozen=True)
class Finished:
    """An attempt its engine finished: the decoding, and the decoder parameters that made it as the row
    records them (JSON, keys sorted)."""

    attempt: Attempt
    decoded: Decoded
    decoder_params: str
