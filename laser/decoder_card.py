"""What a pipeline reads of a decoder without building one: its card, and a checked choice.

A :class:`DecoderCard` holds the class-level facts the job plans with (the pool it drafts from, what it
produces, the engines that run it, its greedy parameters); a :class:`DecoderChoice` is a card with its
checked parameters. Neither imports torch or transformers (nor the decoders package, which imports this one):
a job checks its decoders, picks its engine and starts its workers before the decoding stack loads; the class
behind a card is the registry's (:func:`laser.decoders.available_decoders`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

PoolNeed = Literal["routed", "global", "none"]


@dataclass(frozen=True)
class DecoderCard:
    """A registered decoder's class attributes (see :class:`laser.decoders.base.Decoder`), as plain data."""

    name: str
    summary: str
    pool: PoolNeed
    produces: Literal["text", "ranking"]
    engines: tuple[str, ...]
    beam_sampling: bool
    requires: tuple[str, ...]
    greedy_params: dict[str, Any] | None  # parameters under which it writes the target's greedy text (None: none)
    home: str  # "module:qualname" of the class

    @classmethod
    def of(cls, decoder: Any) -> DecoderCard:
        """The card of ``decoder``, a registered :class:`laser.decoders.base.Decoder` subclass."""
        return cls(
            name=decoder.name,
            summary=decoder.summary,
            pool=decoder.pool,
            produces=decoder.produces,
            engines=tuple(decoder.engines),
            beam_sampling=decoder.beam_sampling,
            requires=tuple(decoder.requires),
            greedy_params=decoder.greedy_params(),
            home=f"{decoder.__module__}:{decoder.__qualname__}",
        )

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecoderCard:
        return cls(**{**data, "engines": tuple(data["engines"]), "requires": tuple(data["requires"])})


@dataclass(frozen=True)
class DecoderChoice:
    """A decoder's card and its checked parameters: what a config's decoder resolves to."""

    card: DecoderCard
    params: dict[str, Any]

    @property
    def name(self) -> str:
        return self.card.name
