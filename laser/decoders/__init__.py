"""Decoder interface, registry and built-in decoders."""
from laser.decoders.base import Decoder, Generation
from laser.decoders.registry import available_decoders, get_decoder, register_decoder
from laser.decoders import beam, builtin, draft_model, dsbd, redrafter  # noqa: F401  (registers the built-ins)

__all__ = ["Decoder", "Generation", "available_decoders", "get_decoder", "register_decoder"]
