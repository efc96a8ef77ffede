"""vLLM as an engine of the decoding core, with LASER as vLLM's drafter (docs/engines.md).

LASER plugs into vLLM through public extension points: the ``custom_class`` proposer
(:class:`laser.vllm.proposer.LaserProposer`) and the ``vllm.general_plugins`` entry point
(:mod:`laser.vllm.plugin`). Importing this package does not import vLLM; :class:`VllmEngine` does, when
built.

A team's own vLLM (``LLM(...)``, ``vllm serve``, ``ray.data.llm``) uses LASER with two calls
(docs/vllm-dropin.md): :func:`speculative_config` for the engine, :func:`request_args` for each request.

Modules: ``engine`` (the request loop), ``env`` (process environment and vLLM configuration),
``calibrate`` (step-cost measurement), ``request_args`` (a request's LASER arguments across the process
boundary), ``proposer`` (the drafter inside vLLM), ``chain_budget`` and ``step_cost`` (the proposer's draft
lengths and what a step costs), ``sources`` (where a request's pool comes from in vLLM's process),
``relaxed`` and ``plugin`` (the relaxed rule inside vLLM's verification), ``forms`` (decoders and rules in
vLLM's terms).

Its names load on first use (PEP 562), so importing one of its modules loads only that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laser.lazy import lazy_attributes

if TYPE_CHECKING:
    from laser.vllm.engine import VllmEngine
    from laser.vllm.results import VllmResult
    from laser.vllm.env import speculative_config, vllm_env
    from laser.vllm.proposer import RowStats
    from laser.vllm.sources import PromptLookup, add_pool_roots, get_source, register_source, unregister_source
    from laser.vllm.request_args import LaserArgs, LaserArgsError, request_args

_HOME = {  # each name -> the module that defines it (laser/lazy.py imports it on first use)
    "VllmEngine": "laser.vllm.engine",
    "VllmResult": "laser.vllm.results",
    "speculative_config": "laser.vllm.env",
    "vllm_env": "laser.vllm.env",
    "RowStats": "laser.vllm.proposer",
    "PromptLookup": "laser.vllm.sources",
    "add_pool_roots": "laser.vllm.sources",
    "get_source": "laser.vllm.sources",
    "register_source": "laser.vllm.sources",
    "unregister_source": "laser.vllm.sources",
    "LaserArgs": "laser.vllm.request_args",
    "LaserArgsError": "laser.vllm.request_args",
    "request_args": "laser.vllm.request_args",
}


__getattr__ = lazy_attributes(__name__, _HOME)

__all__ = [
    "speculative_config",
    "request_args",
    "add_pool_roots",
    "VllmEngine",
    "VllmResult",
    "vllm_env",
    "PromptLookup",
    "register_source",
    "unregister_source",
    "get_source",
    "RowStats",
    "LaserArgs",
    "LaserArgsError",
]
