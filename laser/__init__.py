"""LASER decoding core: draft trees, tree-attention verification, KV-cache compaction and decoders.

Model-agnostic and free of pipeline concerns: a retrieval pool reaches a decoder only as an object
that can open a drafter (see :mod:`laser.drafting`).
"""

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
