"""The actor layout: how many worker actors, of how many threads, when ``execution`` says ``auto``.

The rule comes from the whole job measured on each layout (``laser bench engines``, the demo job warm on
a 2-core CPU; docs/results/engines-vllm-1x2.md, engines-hf-1x2.md): one actor holding both cores wrote
the job 1.31x faster than two 1-thread actors on vLLM (134.5 s against 176.4 s) and 1.22x on ``hf``
(262.2 s against 320.8 s). An engine batches the requests of every slot into one forward, so one engine
per node with all its cores beats engines that split them. So:

- on CPU (``gpus_per_worker: 0``): one actor per node, with all the CPUs Ray sees on that node (the
  smallest node's count on a cluster, so every actor fits anywhere);
- on GPU: one actor per ``gpus_per_worker`` share of the GPUs Ray sees, and the node's CPUs split
  between the actors a node holds.

A number given in the config is kept; ``auto`` fills the other from it (``num_workers: 4`` on an
8-CPU machine gives 2 threads each).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from pipelines.config import ExecutionConfig, ModelConfig
    from pipelines.data.config import DatasetConfig
    from pipelines.workers.actors import ModelSpec


class JobSettings(Protocol):
    """What the actors of a job are made from: any job config with these sections (knowledge, recommendation)."""

    @property
    def execution(self) -> ExecutionConfig: ...

    @property
    def model(self) -> ModelConfig: ...

    @property
    def dataset(self) -> DatasetConfig: ...


log = logging.getLogger(__name__)


class Layout(NamedTuple):
    """``num_workers`` actors of ``threads`` CPU threads each, and why."""

    num_workers: int
    threads: int
    why: str


@dataclass(frozen=True)
class Machine:
    """What the actors can run on: each node's CPUs and GPUs (as Ray counts them)."""

    cpus: tuple[int, ...]
    gpus: tuple[float, ...]

    @classmethod
    def local(cls) -> "Machine":
        """This machine: the CPUs this process may run on (its CPU affinity), its CUDA GPUs."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return cls((cpus,), (float(_cuda_devices()),))

    @classmethod
    def cluster(cls) -> "Machine":
        """The nodes of the Ray cluster this driver is connected to (alive ones)."""
        import ray

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        return cls(
            tuple(int(n.get("CPU", 0)) for n in nodes) or (1,), tuple(float(n.get("GPU", 0)) for n in nodes) or (0.0,)
        )


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable torch build: no GPU to count
        return 0


def plan_layout(machine: Machine, num_workers: int | str, threads: int | str, gpus_per_worker: float) -> Layout:
    """The layout for the configured values (ints kept, ``"auto"`` filled) on ``machine``."""
    node_cpus = max(1, min(machine.cpus))
    if gpus_per_worker > 0:  # actors per node: its GPU shares
        per_node = [int(g // gpus_per_worker) for g in machine.gpus]
        why = f"one actor per {gpus_per_worker:g} GPU ({sum(machine.gpus):g} GPUs)"
    else:  # one actor per node
        per_node = [1] * len(machine.cpus)
        why = f"one actor per node ({len(machine.cpus)} node(s), {node_cpus} CPUs each)"
    auto_n, fits = max(1, sum(per_node)), max(1, max(per_node))
    if num_workers == "auto" and threads == "auto":
        return Layout(auto_n, max(1, node_cpus // fits), why)
    if num_workers == "auto":  # threads given: as many actors as the nodes' CPUs hold
        n = sum(max(1, c // int(threads)) for c in machine.cpus) if gpus_per_worker == 0 else auto_n
        return Layout(n, int(threads), f"{threads} thread(s) per actor")
    if threads == "auto":  # actors given: the node's CPUs shared between the actors it holds
        per = math.ceil(int(num_workers) / len(machine.cpus))
        return Layout(int(num_workers), max(1, node_cpus // per), f"{num_workers} actor(s) configured")
    return Layout(int(num_workers), int(threads), "configured")


def job_layout(execution: ExecutionConfig) -> Layout:
    """The layout of a job's ``execution`` block on the machine it runs on (this one, or the Ray cluster
    at ``execution.address``); logged when anything was ``auto``."""
    num_workers, threads = execution.num_workers, execution.threads_per_worker
    if num_workers != "auto" and threads != "auto":
        return Layout(int(num_workers), int(threads), "configured")
    if execution.address:
        from pipelines.workers.driver import ensure_ray

        ensure_ray(execution.address, num_cpus=0)
        machine = Machine.cluster()
    else:
        machine = Machine.local()
    layout = plan_layout(machine, num_workers, threads, execution.gpus_per_worker)
    log.info(
        "actor layout: %d actor(s) x %d thread(s) (%s; execution.num_workers / threads_per_worker: auto)",
        layout.num_workers,
        layout.threads,
        layout.why,
    )
    return layout


Settings = TypeVar("Settings", bound="JobSettings")


def with_layout(cfg: Settings) -> Settings:
    """A copy of the job config ``cfg`` with its ``execution`` layout resolved to numbers."""
    layout = job_layout(cfg.execution)
    return cfg.model_copy(  # type: ignore[attr-defined, no-any-return]  # a pydantic model
        update={
            "execution": cfg.execution.model_copy(
                update={"num_workers": layout.num_workers, "threads_per_worker": layout.threads}
            )
        }
    )


# Compiling the model pays only in longer runs. Measured on the 2-core CPU (64 requests of 256-token
# prompts, 16 in flight): an eager engine starts in 12 s against 39 s for a compiled one whose compile
# cache is warm (about 3 minutes when it is cold), and runs 3% (LASER drafting) to 14% (plain decoding)
# slower, about 0.04-0.13 s per entity. Below this many entities the start saved is the larger.
COMPILE_FROM_ENTITIES = 500


def compile_model(execution: ExecutionConfig, entities: int | None) -> bool:
    """Whether the actors' vLLM engines compile the model: ``execution.compile``, where ``auto`` compiles
    for a run of ``entities`` >= :data:`COMPILE_FROM_ENTITIES` or of unknown size (None)."""
    if execution.compile != "auto":
        return bool(execution.compile)
    return entities is None or entities >= COMPILE_FROM_ENTITIES


def job_actors(cfg: JobSettings, entities: int | None = None, engine: str = "hf") -> tuple[ModelSpec, int]:
    """The ``ModelSpec`` every actor of the job config ``cfg`` loads, and how many actors; ``entities``:
    the run's size, when known (it decides ``execution.compile: auto``); ``engine``: what a generation
    actor drives (resolved by the job)."""
    from pipelines.workers.actors import ModelSpec

    ex, layout = cfg.execution, job_layout(cfg.execution)
    spec = ModelSpec(
        model=cfg.model.name,
        dtype=cfg.model.dtype,
        threads=layout.threads,
        seed=cfg.dataset.seed,
        gpus=ex.gpus_per_worker,
        compile=compile_model(ex, entities),
        gpu_memory_utilization=ex.gpu_memory_utilization,
        engine=engine,
        revision=cfg.model.revision,
        trust_remote_code=cfg.model.trust_remote_code,
        max_model_len=cfg.model.max_model_len,
        engine_args=dict(cfg.model.engine_args),
    )
    return spec, layout.num_workers
