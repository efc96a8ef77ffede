"""LASER decoding core: draft trees, tree-attention verification, KV-cache compaction and decoders.

Model-agnostic and free of pipeline concerns: a retrieval pool reaches a decoder only as an object
that can open a drafter (see :mod:`laser.drafting`).

Its names load on first use (PEP 562): importing one module of the package (a parser, the CLI's
requirements check) does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laser.lazy import lazy_attributes

if TYPE_CHECKING:
    from laser.decoders import Decoder, Generation, available_decoders, get_decoder, register_decoder
    from laser.drafting import DraftSource, Drafter, NoDrafter
    from laser.engine import TreeDecodingEngine
    from laser.request import DecodeStats, Request
    from laser.models import DEFAULT_MODEL, LoadedModel, load_model, load_tokenizer
    from laser.testing import tiny_llama
    from laser.tree import DraftTree
    from laser.rules import GenerationRules
    from laser.sampling import GREEDY, SamplingParams
    from laser.verify import BeamVerifier, Outcome, RejectionSampler, TopKVerifier, Verifier

_HOME = {  # each name -> the module that defines it (laser/lazy.py imports it on first use)
    "Decoder": "laser.decoders",
    "Generation": "laser.decoders",
    "available_decoders": "laser.decoders",
    "get_decoder": "laser.decoders",
    "register_decoder": "laser.decoders",
    "DraftSource": "laser.drafting",
    "Drafter": "laser.drafting",
    "NoDrafter": "laser.drafting",
    "TreeDecodingEngine": "laser.engine",
    "DecodeStats": "laser.request",
    "Request": "laser.request",
    "DEFAULT_MODEL": "laser.models",
    "LoadedModel": "laser.models",
    "load_model": "laser.models",
    "load_tokenizer": "laser.models",
    "tiny_llama": "laser.testing",
    "DraftTree": "laser.tree",
    "GenerationRules": "laser.rules",
    "GREEDY": "laser.sampling",
    "SamplingParams": "laser.sampling",
    "BeamVerifier": "laser.verify",
    "Outcome": "laser.verify",
    "RejectionSampler": "laser.verify",
    "TopKVerifier": "laser.verify",
    "Verifier": "laser.verify",
}


__getattr__ = lazy_attributes(__name__, _HOME)

__all__ = [
    "DEFAULT_MODEL",
    "GREEDY",
    "BeamVerifier",
    "DecodeStats",
    "Decoder",
    "DraftSource",
    "DraftTree",
    "Drafter",
    "Generation",
    "GenerationRules",
    "LoadedModel",
    "NoDrafter",
    "Outcome",
    "RejectionSampler",
    "Request",
    "SamplingParams",
    "TopKVerifier",
    "TreeDecodingEngine",
    "Verifier",
    "available_decoders",
    "get_decoder",
    "load_model",
    "load_tokenizer",
    "register_decoder",
    "tiny_llama",
]
