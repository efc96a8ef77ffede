"""Decoder interface, registry and built-in decoders.

Its names load on first use (PEP 562): ``laser.decoders.card`` (a decoder's card and a checked choice) reads
without torch; the registry, on first use, imports every built-in decoder family (which registers them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from laser.lazy import lazy_attributes

if TYPE_CHECKING:
    from laser.decoders.base import Decoder, Generation
    from laser.decoders.card import DecoderCard, DecoderChoice
    from laser.decoders.registry import available_decoders, get_decoder, register_decoder, resolve_decoder

__getattr__ = lazy_attributes(
    __name__,
    {
        "Decoder": "laser.decoders.base",
        "Generation": "laser.decoders.base",
        "DecoderCard": "laser.decoders.card",
        "DecoderChoice": "laser.decoders.card",
        "available_decoders": "laser.decoders.registry",
        "get_decoder": "laser.decoders.registry",
        "register_decoder": "laser.decoders.registry",
        "resolve_decoder": "laser.decoders.registry",
    },
)

__all__ = [
    "Decoder",
    "DecoderCard",
    "DecoderChoice",
    "Generation",
    "available_decoders",
    "get_decoder",
    "register_decoder",
    "resolve_decoder",
]
