"""vLLM as an engine of the decoding core, with LASER as vLLM's drafter (docs/engines.md).

LASER plugs into vLLM through public extension points: the ``custom_class`` proposer
(:class:`laser.vllm.proposer.LaserProposer`) and the ``vllm.general_plugins`` entry point
(:mod:`laser.vllm.plugin`). Importing this package does not import vLLM; :class:`VllmEngine` does, when
built.
"""
from laser.vllm.engine import VllmEngine, VllmResult, vllm_env
from laser.vllm.pools import PromptLookup, get_source, register_source, unregister_source
from laser.vllm.proposer import RowStats

__all__ = ["VllmEngine", "VllmResult", "vllm_env", "PromptLookup", "register_source", "unregister_source",
           "get_source", "RowStats"]
