"""The engines a knowledge worker can drive, in one registry.

``execution.engine`` names one of :data:`ENGINES` (``auto`` is resolved by
:func:`pipelines.knowledge.decoders.job_engine`); the worker actor builds that adapter from its
:class:`~pipelines.workers.ModelSpec` (``spec.engine``) and holds it. Nothing else picks an engine.
An adapter's module is imported only when a worker builds it (vLLM's only where it runs).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from pipelines.knowledge.engines.base import EngineAdapter, EngineClock

if TYPE_CHECKING:
    from pipelines.knowledge.engines.hf import HfAdapter
    from pipelines.knowledge.engines.vllm import VllmAdapter
    from pipelines.workers import ModelSpec

    _CHECKED: tuple[type[EngineAdapter], ...] = (HfAdapter, VllmAdapter)  # mypy: each implements the protocol

ENGINES: dict[str, str] = {  # execution.engine -> the adapter class, as module:name
    "hf": "pipelines.knowledge.engines.hf:HfAdapter",
    "vllm": "pipelines.knowledge.engines.vllm:VllmAdapter",
}


def build_adapter(spec: ModelSpec) -> EngineAdapter:
    """The adapter of ``spec.engine``, built (it loads what its engine needs)."""
    if spec.engine not in ENGINES:
        raise ValueError(f"engine {spec.engine!r}: must be one of {sorted(ENGINES)}")
    module, name = ENGINES[spec.engine].split(":")
    adapter: EngineAdapter = getattr(import_module(module), name)(spec)
    return adapter


__all__ = ["ENGINES", "EngineAdapter", "EngineClock", "build_adapter"]
