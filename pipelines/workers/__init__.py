"""The one Ray driver of every job that runs the model over entities (knowledge, recommendation).

``actors.py``: what a worker actor is (one model load, a decoder cache, a stream of requests in and
results out, with a ``serve`` method per job kind); ``driver.py``: the driver that feeds a group of
those actors with pool affinity, re-sends a dead actor's requests and yields results as they finish.
"""

from pipelines.workers.actors import (
    DecoderCache,
    Failure,
    GenerationRequest,
    HistoryEntry,
    ModelSpec,
    ModelWorker,
    StreamWorker,
    WorkerDead,
    WorkResult,
    actor_options,
    encode_params,
)
from pipelines.workers.driver import (
    ACTOR_RESTARTS,
    BatchScheduler,
    EngineUnusable,
    LocalGroup,
    Stalled,
    WorkerGroup,
    ensure_ray,
    make_batches,
)

__all__ = [
    "ACTOR_RESTARTS",
    "BatchScheduler",
    "DecoderCache",
    "EngineUnusable",
    "Failure",
    "GenerationRequest",
    "HistoryEntry",
    "LocalGroup",
    "ModelSpec",
    "ModelWorker",
    "Stalled",
    "StreamWorker",
    "WorkResult",
    "WorkerDead",
    "WorkerGroup",
    "actor_options",
    "encode_params",
    "ensure_ray",
    "make_batches",
]
