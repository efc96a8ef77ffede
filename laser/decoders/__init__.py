"""Decoder interface, registry and built-in decoders. A decoder's card, which reads without torch, is
:mod:`laser.decoder_card`."""

from laser.decoders.base import Decoder, Generation
from laser.decoder_card import DecoderChoice
from laser.decoders.registry import available_decoders, get_decoder, register_decoder, resolve_decoder

# importing a family's decoders module registers its decoders
from laser.decoders import builtin  # noqa: F401
from laser.decoders.beam import decoders as _beam  # noqa: F401
from laser.decoders.draft_model import decoders as _draft_model  # noqa: F401
from laser.decoders.dsbd import decoders as _dsbd  # noqa: F401
from laser.decoders.redrafter import decoder as _redrafter  # noqa: F401

__all__ = [
    "Decoder",
    "DecoderChoice",
    "Generation",
    "available_decoders",
    "get_decoder",
    "register_decoder",
    "resolve_decoder",
]
