"""Stateless work spread over the Ray cluster as tasks: one call per item, on any node, under a progress bar.

Tasks reserve no CPU (generation actors may hold them all while a job's other steps run), so at most as many
run at once as the cluster has CPUs; ``SPREAD`` puts them on every node. A task that fails because its worker
process died is retried by Ray; one that raises ends the map with its error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from tqdm.auto import tqdm

from pipelines.workers.interrupts import ray_wait

if TYPE_CHECKING:
    from ray import ObjectRef

T = TypeVar("T")


def map_tasks(
    fn: Callable[..., T],
    calls: Sequence[tuple[object, ...]],
    shared: dict[str, object] | None = None,
    *,
    desc: str,
    unit: str = "task",
) -> list[T]:
    """``fn(*call, **shared)`` for every call as Ray tasks (``shared``: object refs every call gets), results
    in call order. Ray must be initialised."""
    import ray

    remote = ray.remote(fn).options(num_cpus=0, scheduling_strategy="SPREAD", max_retries=2)
    limit = max(1, int(ray.cluster_resources().get("CPU", 1)))
    results: dict[int, T] = {}
    running: dict[ObjectRef[T], int] = {}
    todo = list(enumerate(calls))[::-1]
    with tqdm(total=len(calls), desc=desc, unit=unit) as bar:
        while todo or running:
            while todo and len(running) < limit:
                index, call = todo.pop()
                running[remote.remote(*call, **(shared or {}))] = index
            done, _ = ray_wait(list(running))
            for ref in done:
                results[running.pop(ref)] = ray.get(ref)
                bar.update(1)
    return [results[i] for i in range(len(calls))]
