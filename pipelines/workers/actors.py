"""Worker actors: one model loaded once, decoders built on demand, requests streamed through ``serve``.

A job kind subclasses :class:`StreamWorker` (or :class:`ModelWorker`, which loads a transformers model and
builds decoders on it) and writes ``serve(task, take, slots)``: pull requests with
``take(n)`` and yield a :class:`WorkResult` as each one (or each batch) finishes. The base class turns
that into the two ways the actor is used: ``generate`` (in-process, a list of requests in, one result
out: tests and tools) and ``exchange`` (the driver's streaming call: a background thread decodes while
the driver sends more requests and collects finished ones).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from collections.abc import Hashable
from typing import TYPE_CHECKING, Callable, Generic, Iterator, Mapping, NamedTuple, TypedDict, TypeVar


if TYPE_CHECKING:
    from laser.decoders.base import Decoder
    from laser.models import LoadedModel

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (entity_type, entity_id)
TaskT = TypeVar("TaskT", bound=Hashable)  # what a job kind's requests share (DecodeTask, RecommendTask): one per pass
RowT = TypeVar("RowT")  # what a job kind writes per entity (KnowledgeRow, UserRanking)


class WorkerDead(RuntimeError):
    """Raised by :meth:`StreamWorker.exchange` once the worker can serve nothing more (its engine died again
    after its one restart): the driver counts the actor as dead and hands its requests to the others."""


def encode_params(params: Mapping[str, object]) -> str:
    """Decoder parameters as canonical JSON (keys sorted, no spaces): a worker's decoder-cache key and the
    stored ``decoder_params`` column."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


class HistoryEntry(NamedTuple):
    """One rated item in a user's history; ``genres`` (optional) give a small model something to go on.
    Implicit feedback: ``rating`` None, ``event`` (view, purchase, ... or None) and ``weight`` set."""

    title: str
    rating: float | None
    genres: tuple[str, ...] = ()
    event: str | None = None
    weight: float | None = None


@dataclass
class GenerationRequest:
    """One entity to work on. Users carry ``history`` ((title, rating) oldest first), items carry ``item``
    (a row of the items table). ``pool_key`` None means no drafting pool."""

    entity_type: str
    entity_id: str
    pool_key: str | None = None
    pool_kind: str | None = None
    group_id: str | None = None
    history: list[HistoryEntry] | None = None
    item: dict[str, object] | None = None
    user: dict[str, object] | None = None  # a user's attribute columns (the prompt template may show them)
    source_hash: str | None = None  # what the knowledge is generated from (pipelines/knowledge/source_hash.py)
    earlier: str | None = None  # the entity's newest earlier knowledge: its first draft source (refresh)

    @property
    def key(self) -> Key:
        return self.entity_type, self.entity_id


class Loading(TypedDict):
    """The keywords of ``laser.load_model``/``load_tokenizer`` beyond the model's name."""

    revision: str | None
    trust_remote_code: bool


@dataclass(frozen=True)
class ModelSpec:
    """What an actor loads once: the model, its dtype, the torch threads (= Ray CPUs) and the Ray GPUs
    (a fraction shares one GPU) it uses."""

    model: str
    dtype: str = "auto"
    threads: int = 1
    seed: int = 0
    gpus: float = 0.0
    compile: bool = True  # engines that compile the model (vLLM) do; pipelines/workers/layout.compile_model
    gpu_memory_utilization: float | None = None  # vLLM's share of each GPU; None: 0.9 of the actor's share
    engine: str = "hf"  # the engine a generation worker drives (pipelines/knowledge/engines: its registry)
    engine_options: Mapping[str, object] = field(default_factory=dict, hash=False)  # more keywords for its engine
    revision: str | None = None  # the model's hub revision (transformers and vLLM)
    trust_remote_code: bool = False  # run the model repo's own code
    max_model_len: int | None = None  # vLLM's tokens per request; None: the model's own, within the KV cache
    engine_args: Mapping[str, object] = field(default_factory=dict, hash=False)  # vLLM's own (model.engine_args)
    pool_roots: tuple[str, ...] = ()  # where the job's pool stores lie (vLLM opens no store elsewhere)

    def loading(self) -> Loading:
        """The keywords of ``laser.load_model``/``load_tokenizer`` beyond the model's name."""
        return {"revision": self.revision, "trust_remote_code": self.trust_remote_code}

    @property
    def device(self) -> str:
        """Where the model runs: the GPU Ray assigns when the actor reserves GPUs, else the CPU."""
        return "cuda" if self.gpus > 0 else "cpu"


def actor_options(spec: ModelSpec) -> dict[str, float]:
    """The Ray resources one worker actor reserves."""
    return {"num_cpus": spec.threads, "num_gpus": spec.gpus}


@dataclass(frozen=True)
class Failure:
    """An entity a worker could not generate, and why. ``decoded``: its text was decoded and judged (a flaw
    the quality guard refused), so the engine itself works: the driver's first-batch watch never takes it for
    a broken engine."""

    entity_type: str
    entity_id: str
    reason: str
    decoded: bool = False

    @classmethod
    def of(cls, req: GenerationRequest, exc: BaseException, decoded: bool = False) -> Failure:
        """The failure of ``req`` on ``exc`` (its type and message as the reason)."""
        return cls(req.entity_type, req.entity_id, f"{type(exc).__name__}: {exc}", decoded)


@dataclass
class WorkResult(Generic[RowT]):
    """What finished: ``rows`` (the job kind's output per entity), failures and the actor's decoding seconds for
    them (shared steps counted once)."""

    rows: list[RowT] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    decode_s: float = 0.0

    def merge(self, other: "WorkResult[RowT]") -> None:
        self.rows += other.rows
        self.failures += other.failures
        self.decode_s += other.decode_s

    def row_key(self, row: RowT) -> Key:
        """The entity a row belongs to; job kinds whose rows are not mappings with ``entity_type`` and
        ``entity_id`` say how."""
        if not isinstance(row, Mapping):
            raise TypeError(f"{type(self).__name__} cannot tell the entity of a {type(row).__name__} row")
        return str(row["entity_type"]), str(row["entity_id"])

    def keys(self) -> list[Key]:
        """Every entity this result finishes, written or failed."""
        return [self.row_key(r) for r in self.rows] + [(f.entity_type, f.entity_id) for f in self.failures]


class DecoderCache:
    """Decoders on one loaded model, each built once per (name, parameters)."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self._built: dict[str, tuple[Decoder, str]] = {}

    def get(self, name: str, params: Mapping[str, object]) -> tuple[Decoder, str]:
        """(decoder, its parameters as JSON) for decoder ``name`` with ``params``."""
        import laser

        key = f"{name}:{encode_params(params)}"
        if key not in self._built:
            dec = laser.get_decoder(name, self.lm, **params)
            self._built[key] = (dec, encode_params(dec.params()))
        return self._built[key]


class StreamWorker(Generic[TaskT, RowT]):
    """Base of the worker actors, generic over the task their requests share and the row they write:
    subclasses write :meth:`serve`; this class streams requests through it."""

    def __init__(self, spec: ModelSpec) -> None:
        import torch

        torch.set_num_threads(spec.threads)
        torch.manual_seed(spec.seed)
        if spec.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"execution.gpus_per_worker={spec.gpus} but this node has no usable CUDA GPU")
        self.spec = spec
        self._lock = threading.Lock()
        self._inbox: deque[tuple[TaskT, GenerationRequest]] = deque()
        self._outbox: queue.Queue[WorkResult[RowT]] = queue.Queue()
        self._held: set[Key] = set()
        self._taken: set[Key] = set()  # held keys the serve loop took from the inbox and has not finished
        self._dead: str | None = None  # why the worker can serve nothing more (:class:`WorkerDead`)
        self._worker: threading.Thread | None = None

    def result(self, failures: list[Failure] | None = None) -> WorkResult[RowT]:
        """An empty result of this worker's kind (``failures`` in it): what :meth:`serve` yields."""
        return WorkResult(failures=failures or [])

    def ready(self, slots: int) -> dict[str, object]:
        """Ready the engine for ``slots`` requests in flight (the driver calls it once, right after the actor
        starts); returns what the start did, for the log."""
        return {"model": self.spec.model}

    def serve(
        self, task: TaskT, take: Callable[[int], list[GenerationRequest]], slots: int
    ) -> Iterator[WorkResult[RowT]]:
        """Work on requests pulled with ``take(n)`` (at most ``slots`` at a time), yielding what finishes.
        A request that fails becomes a failure record in a result; it never stops the stream."""
        raise NotImplementedError

    def generate(self, task: TaskT, requests: list[GenerationRequest], slots: int | None = None) -> WorkResult[RowT]:
        """Every request's result, worked on in this thread with ``slots`` in flight (default: all)."""
        waiting = deque(requests)
        out = self.result()
        for part in self.serve(
            task, lambda n: [waiting.popleft() for _ in range(min(n, len(waiting)))], slots or max(1, len(requests))
        ):
            out.merge(part)
        return out

    # ---- the driver's streaming call ------------------------------------------------------------

    def exchange(
        self, task: TaskT, requests: list[GenerationRequest], slots: int, wait_s: float = 0.5
    ) -> tuple[WorkResult[RowT], set[Key]]:
        """Queue ``requests`` for the background thread, wait up to ``wait_s`` for finished ones, and return
        them with the keys of every request this actor still holds (queued or in work). The driver calls
        it once at a time per actor; a key it sent that is neither returned nor held was lost (restart).
        A dead worker returns what it finished, holding nothing; then raises :class:`WorkerDead`."""
        with self._lock:
            if self._dead is not None and self._outbox.empty():
                raise WorkerDead(self._dead)
            for req in requests if self._dead is None else []:
                self._inbox.append((task, req))
                self._held.add(req.key)
            if self._dead is None and (self._worker is None or not self._worker.is_alive()):
                self._worker = threading.Thread(target=self._serve_inbox, args=(slots,), daemon=True)
                self._worker.start()
        out = self.result()
        try:
            out.merge(self._outbox.get(timeout=wait_s))
            while True:
                out.merge(self._outbox.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            self._held.difference_update(out.keys())
            return out, set(self._held) if self._dead is None else set()  # a dead worker's work is lost

    def _serve_inbox(self, slots: int) -> None:
        """Background thread: serve the inbox task by task (passes never mix in one stream). When ``serve``
        raises, every request of that task it held fails with the error (the driver hears of it at once);
        when the worker is dead (:class:`WorkerDead`), the thread stops and ``exchange`` says so."""
        while True:
            with self._lock:
                if not self._inbox:
                    self._worker = None
                    return
                task = self._inbox[0][0]
            try:
                for part in self.serve(task, partial(self._take, task), slots):
                    with self._lock:
                        self._taken.difference_update(part.keys())
                    self._outbox.put(part)
            except WorkerDead as exc:
                log.error("worker dead: %s", exc)
                with self._lock:
                    self._dead, self._worker = str(exc), None
                return
            except Exception as exc:  # noqa: BLE001 - a broken serve loop must never strand its requests
                log.exception("serving a task failed; its %d requests fail with the error", len(self._taken))
                self._outbox.put(self._fail_task(task, f"worker error: {type(exc).__name__}: {exc}"))

    def _take(self, task: TaskT, n: int) -> list[GenerationRequest]:
        """Up to ``n`` queued requests of ``task`` (the serve loop's ``take``)."""
        with self._lock:
            got: list[GenerationRequest] = []
            while self._inbox and len(got) < n and self._inbox[0][0] == task:
                got.append(self._inbox.popleft()[1])
            self._taken.update(r.key for r in got)
            return got

    def _fail_task(self, task: TaskT, reason: str) -> WorkResult[RowT]:
        """A result failing every request of ``task`` the worker holds: in work or still queued."""
        with self._lock:
            keys = sorted(self._taken)
            self._taken.clear()
            while self._inbox and self._inbox[0][0] == task:
                keys.append(self._inbox.popleft()[1].key)
        return self.result([Failure(t, i, reason) for t, i in keys])


class ModelWorker(StreamWorker[TaskT, RowT]):
    """A worker actor that loads ``spec``'s transformers model once and builds decoders on it."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        import laser

        self.lm = laser.load_model(spec.model, device=spec.device, dtype=spec.dtype, **spec.loading())
        self.decoders = DecoderCache(self.lm)

    def decoder(self, name: str, params: Mapping[str, object]) -> tuple[Decoder, str]:
        """(decoder, its parameters as JSON) for decoder ``name`` with ``params`` on the actor's model."""
        return self.decoders.get(name, params)
