"""The driver: a group of worker actors fed with pool affinity, results yielded as they finish.

Each actor gets one :meth:`~pipelines.workers.actors.StreamWorker.exchange` call at a time: new requests
in (chunks of one pool key, so an actor loads few pools; enough to keep its queue ``slots // 2`` ahead
of its slots), finished results out. A request an actor lost (its process died and Ray restarted it)
is sent again, up to ``ACTOR_RESTARTS`` times; an actor that stays dead hands its requests to the
others. The caller writes each result as it comes (crash-safe stores), so a retried request is never
written twice. Local Ray is started in-process when no address is configured.

A run that cannot work stops with :class:`EngineUnusable` (one line naming the engine's error) instead of
one failure per entity: no actor started its engine, every actor is dead, or the first batch's worth of
every actor failed with one identical reason and nothing succeeded (:class:`FirstFailures`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING, Generic, Iterable, Iterator, cast

from tqdm.auto import tqdm

from pipelines.workers.interrupts import ray_wait
from pipelines.workers.actors import (
    Failure,
    GenerationRequest,
    Key,
    ModelSpec,
    RowT,
    StreamWorker,
    TaskT,
    WorkerDead,
    WorkResult,
    actor_options,
)

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

log = logging.getLogger(__name__)

ACTOR_RESTARTS = 3  # restarts of a worker actor whose process died, and re-sends of a request it lost
PROGRESS_TIMEOUT_S = 600.0  # a worker holding requests that returns none of them for this long has stalled


class EngineUnusable(RuntimeError):
    """The workers cannot run the job at all (their engine cannot start, cannot run the model, or died):
    ``reason`` is the engine's error in one line. The run stops; what it wrote is kept."""

    def __init__(self, what: str, reason: str) -> None:
        self.reason = one_line(reason)
        super().__init__(f"engine unusable ({what}): {self.reason}")


class Stalled(EngineUnusable):
    """A worker held requests and finished none of them for the group's progress timeout: the run stops
    (its lock released, exit 1) instead of waiting for ever."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace collapsed), cut at ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_RAISED = re.compile(r"^[A-Za-z_][\w.]*: ")  # a traceback's last line: "ValueError: ..."


def error_line(exc: BaseException) -> str:
    """An error as one line, ``Type: message``: what the worker raised, for a Ray error wrapping it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):  # a Ray task error: the worker's own exception
        exc = cause
    if isinstance(exc, WorkerDead):
        return one_line(str(exc))
    if type(exc).__module__.startswith("ray."):  # an actor that died in its constructor: its traceback's end
        lines = str(exc).splitlines()
        last = max((i for i, ln in enumerate(lines) if _RAISED.match(ln)), default=None)
        if last is not None:
            return one_line(" ".join(lines[last:]))
    return one_line(f"{type(exc).__name__}: {exc}")


class FirstFailures(Generic[RowT]):
    """Holds back a stream's failures while nothing has succeeded and every failure has one reason; raises
    :class:`EngineUnusable` once each actor sent work failed its first ``slots`` (or all it was sent) so.

    A row, a failure with another reason or one that judged a decoded text (``decoded`` set) releases what
    was held and ends the watch."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.reason: str | None = None
        self.held: list[WorkResult[RowT]] = []
        self.watching = True
        self.sent: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()

    def see(self, actor: int, result: WorkResult[RowT], alive: set[int]) -> list[WorkResult[RowT]]:
        """The results to hand on now (none while held back)."""
        if not self.watching:
            return [result]
        reasons = {f.reason for f in result.failures} | ({self.reason} if self.reason else set())
        if result.rows or len(reasons) > 1 or any(f.decoded for f in result.failures):
            return self.release() + [result]  # the engine works (a decoded failure's text was judged)
        if not result.failures:
            return [result]
        reason = self.reason = reasons.pop()
        self.held.append(result)
        self.failed[actor] += len(result.failures)
        if all(self.failed[a] >= min(self.slots, self.sent[a]) for a in alive if self.sent[a]):
            raise EngineUnusable("every request of the first batch failed with one error", reason)
        return []

    def release(self) -> list[WorkResult[RowT]]:
        """What was held back; the watch ends."""
        out, self.held, self.watching = self.held, [], False
        return out


def ensure_ray(address: str | None, num_cpus: int) -> None:
    """Connect to Ray: reuse a running session, join ``address``, or start local Ray in-process."""
    import ray

    if ray.is_initialized():
        return
    if address:
        log.info("connecting to Ray at %s", address)
        ray.init(address=address, log_to_driver=True)
    else:
        log.info("starting local Ray with %d CPUs", num_cpus)
        # Ray keeps its default (token authentication on a new local cluster) but its notice about it is
        # noise on an in-process run: mute that one logger while the cluster starts.
        notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = notice.level
        notice.setLevel(logging.ERROR)
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        finally:
            notice.setLevel(level)
    from pipelines.workers.interrupts import reassert

    reassert()  # ray.init replaced the SIGTERM handler of an interruptible job


def unpack_bundled(model: str) -> None:
    """A bundled model's first use on this machine: de-quantise it here, under a bar of its own, before
    the local actors start (they then load the cached copy, and their start-up bar shows only theirs)."""
    from laser.models import bundled_unpacked, model_dir

    if not bundled_unpacked(model):
        with tqdm(total=1, desc=f"model: de-quantise bundled {model} (once per machine)", unit="model") as bar:
            model_dir(model)
            bar.update(1)


def make_batches(
    requests: Iterable[GenerationRequest], batch_size: int
) -> dict[str | None, deque[list[GenerationRequest]]]:
    """Requests grouped by pool key (keys and entities in sorted order), cut into batches."""
    by_key: dict[str | None, list[GenerationRequest]] = defaultdict(list)
    for req in requests:
        by_key[req.pool_key].append(req)
    out: dict[str | None, deque[list[GenerationRequest]]] = {}
    for key in sorted(by_key, key=lambda k: (k is None, k or "")):
        reqs = sorted(by_key[key], key=lambda r: r.key)
        out[key] = deque(reqs[i : i + batch_size] for i in range(0, len(reqs), batch_size))
    return out


class BatchScheduler:
    """Hands out batches with pool affinity: an actor keeps its last pool key while that key has work;
    otherwise it takes the key with the most batches left that no other actor is on."""

    def __init__(self, batches: dict[str | None, deque[list[GenerationRequest]]]) -> None:
        self.batches = {k: q for k, q in batches.items() if q}
        self.last: dict[int, str | None] = {}

    def __bool__(self) -> bool:
        return bool(self.batches)

    def left(self) -> int:
        return sum(len(b) for q in self.batches.values() for b in q)

    def next_for(self, actor: int) -> list[GenerationRequest] | None:
        if not self.batches:
            return None
        key = self.last.get(actor, "\0none")
        if key not in self.batches:
            busy = {k for a, k in self.last.items() if a != actor}
            free = [k for k in self.batches if k not in busy] or list(self.batches)
            key = max(free, key=lambda k: len(self.batches[k]))
        batch = self.batches[key].popleft()
        if not self.batches[key]:
            del self.batches[key]
        self.last[actor] = key
        return batch


class WorkerGroup(Generic[TaskT, RowT]):
    """``num_workers`` actors of ``worker_cls`` sharing one model spec; serves several passes, then ``close``."""

    def __init__(
        self,
        worker_cls: type[StreamWorker[TaskT, RowT]],
        spec: ModelSpec,
        num_workers: int,
        address: str | None = None,
        progress_timeout_s: float = PROGRESS_TIMEOUT_S,
    ) -> None:
        self.worker_cls, self.spec, self.num_workers, self.address = worker_cls, spec, num_workers, address
        self.progress_timeout_s = progress_timeout_s
        self.actors: list[ActorHandle[StreamWorker[TaskT, RowT]]] = []
        self.starting: dict[ObjectRef[dict[str, object]], int] = {}  # ready() calls not yet collected -> actor
        self.broken: dict[int, str] = {}  # actors that failed to start or died -> why
        self.resent = 0  # requests a dead actor lost and the driver sent again
        self.startup_s = 0.0  # the driver blocked on Ray, actor start and engine start (``start`` + waits)
        self.ready_s: list[float] = []  # each started actor's engine start, measured in the actor

    @property
    def started(self) -> bool:
        """Whether actors were asked to start."""
        return bool(self.actors)

    def start(self, slots: int, n: int | None = None) -> None:
        """Start the actors (up to ``n``) and have each ready its engine for ``slots`` requests in flight
        (model load, compile) without waiting: the driver goes on with its own work meanwhile."""
        import ray

        t0 = time.perf_counter()
        n = self.num_workers if n is None else min(n, self.num_workers)
        if not self.address:
            unpack_bundled(self.spec.model)
        ensure_ray(self.address, num_cpus=self.num_workers * self.spec.threads)
        if len(self.actors) < n:
            log.info(
                "starting %d worker(s) for %s: each loads the model and readies its engine once for the job",
                n - len(self.actors),
                self.spec.model,
            )
        # a killed actor process is restarted (the model reloads) and the requests it lost are sent again
        remote_cls = ray.remote(self.worker_cls).options(
            **actor_options(self.spec), max_restarts=ACTOR_RESTARTS, max_task_retries=ACTOR_RESTARTS
        )
        while len(self.actors) < n:
            self.actors.append(cast("ActorHandle[StreamWorker[TaskT, RowT]]", remote_cls.remote(self.spec)))
            self.starting[self.actors[-1].ready.remote(slots)] = len(self.actors) - 1
        self.startup_s += time.perf_counter() - t0

    def _wait_ready(self) -> None:
        """Wait for the actors still starting, under a progress bar that names what they do. An actor that
        fails to start is left out of the work; when none started, raises :class:`EngineUnusable`."""
        import ray

        if not self.starting:
            return
        t0 = time.perf_counter()
        with tqdm(total=len(self.starting), desc="workers: load model, start engine", unit="worker") as bar:
            while self.starting:
                ready, _ = ray_wait(list(self.starting))
                for ref in ready:
                    a = self.starting.pop(ref)
                    try:
                        info = ray.get(ref)
                        log.info("worker %d ready: %s", a, info)
                        took = info.get("ready_s")
                        self.ready_s.append(float(took) if isinstance(took, (int, float)) else 0.0)
                    except Exception as exc:  # noqa: BLE001 - left out; the run stops if none started
                        self.broken[a] = error_line(exc)
                        log.error("worker %d failed to start: %s", a, self.broken[a])
                    bar.update(1)
        self.startup_s += time.perf_counter() - t0
        if self.actors and len(self.broken) == len(self.actors):
            raise EngineUnusable("no worker could start", next(iter(self.broken.values())))

    def working(self) -> int:
        """Actors started and not broken (at least 1)."""
        return max(1, len(self.actors) - len(self.broken))

    def stream(
        self, requests: list[GenerationRequest], task: TaskT, *, slots: int, desc: str, unit: str = "entity"
    ) -> Iterator[WorkResult[RowT]]:
        """Work on ``requests`` with ``slots`` in flight per actor; yield results as they finish, under a
        progress bar. Every request ends in exactly one yielded row or failure, unless the workers cannot
        run at all: then :class:`EngineUnusable` (the failures held back are not yielded)."""
        if not requests:
            return
        import ray

        self.start(slots, len(requests))
        self._wait_ready()
        alive = set(range(len(self.actors))) - set(self.broken)
        if not alive:  # every actor failed to start or died in an earlier pass
            raise EngineUnusable("no worker is left", next(iter(self.broken.values())))
        run = _Pass(self, ray.put(task), requests, slots, alive)  # large tasks (a catalogue) travel once
        with tqdm(total=len(requests), desc=desc, unit=unit) as bar:
            for a in alive:
                run.call(a)
            while run.calls:
                ready, _ = ray_wait(list(run.calls))
                if not ready:
                    continue
                [ref] = ready
                a = run.calls.pop(ref)
                for part in run.collect(a, ref):
                    yield part
                    bar.update(len(part.rows) + len(part.failures))
                run.refill(a)
            for part in run.first.release():
                yield part
                bar.update(len(part.failures))

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
        self.starting.clear()
        self.broken.clear()

    def __enter__(self) -> "WorkerGroup[TaskT, RowT]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalGroup(Generic[TaskT, RowT]):
    """The driver's interface on one worker in this process (no Ray): tools and tests."""

    startup_s = 0.0  # the worker is the caller's, started before
    ready_s: list[float] = []

    def __init__(self, worker: StreamWorker[TaskT, RowT]) -> None:
        self.worker = worker

    @property
    def started(self) -> bool:
        return True

    def start(self, slots: int, n: int | None = None) -> None:
        """Nothing to start: the worker belongs to the caller."""

    def working(self) -> int:
        return 1

    def stream(
        self, requests: list[GenerationRequest], task: TaskT, *, slots: int, desc: str = "", unit: str = "entity"
    ) -> Iterator[WorkResult[RowT]]:
        if requests:
            yield self.worker.generate(task, requests, slots)

    def close(self) -> None:
        """Nothing to stop: the worker belongs to the caller."""

    def __enter__(self) -> "LocalGroup[TaskT, RowT]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Pass(Generic[TaskT, RowT]):
    """One :meth:`WorkerGroup.stream`: what each actor holds, what waits to be sent again, the calls in
    flight and the first failures held back."""

    def __init__(
        self,
        group: WorkerGroup[TaskT, RowT],
        task_ref: ObjectRef[TaskT],
        requests: list[GenerationRequest],
        slots: int,
        alive: set[int],
    ) -> None:
        self.group, self.task_ref, self.slots, self.alive = group, task_ref, slots, alive
        self.chunk = max(1, slots // 2)
        self.scheduler = BatchScheduler(make_batches(requests, self.chunk))
        self.outstanding: list[dict[Key, GenerationRequest]] = [{} for _ in group.actors]
        self.retry: deque[GenerationRequest] = deque()
        self.losses: Counter[Key] = Counter()
        self.calls: dict[ObjectRef[tuple[WorkResult[RowT], set[Key]]], int] = {}
        self.first: FirstFailures[RowT] = FirstFailures(slots)
        self.progress = {a: time.monotonic() for a in alive}  # when each actor last finished a request

    def call(self, a: int) -> None:
        """Send actor ``a`` requests (re-sends first) to keep it ``chunk`` ahead of its slots, and ask for
        what it finished."""
        held = self.outstanding[a]
        new: list[GenerationRequest] = []
        while self.retry and len(held) + len(new) < self.slots + self.chunk:
            new.append(self.retry.popleft())
        while self.scheduler and len(held) + len(new) < self.slots + self.chunk:
            new += self.scheduler.next_for(a) or []
        for req in new:
            held[req.key] = req
        self.first.sent[a] += len(new)
        if held:
            self.calls[self.group.actors[a].exchange.remote(self.task_ref, new, self.slots)] = a

    def collect(self, a: int, ref: ObjectRef[tuple[WorkResult[RowT], set[Key]]]) -> list[WorkResult[RowT]]:
        """What actor ``a``'s finished call gave, to hand on now: its requests lost with a dead process are
        sent again (or fail after ``ACTOR_RESTARTS`` losses)."""
        result, held = self._result(a, ref)
        self._check_progress(a, result)
        for key in result.keys():
            self.outstanding[a].pop(key, None)
        for key in [k for k in self.outstanding[a] if k not in held]:  # lost with a dead process
            req = self.outstanding[a].pop(key)
            self.losses[key] += 1
            if self.losses[key] > ACTOR_RESTARTS:
                result.failures.append(Failure(key[0], key[1], f"worker died {self.losses[key]} times working on it"))
            else:
                self.retry.append(req)
                self.group.resent += 1
        return self.first.see(a, result, self.alive)

    def refill(self, a: int) -> None:
        """Call ``a`` again (if alive) and every idle actor; stop when every worker is dead with work left."""
        for b in ([a] if a in self.alive else []) + [b for b in self.alive if b not in self.calls.values() and b != a]:
            self.call(b)
        if not self.calls and (self.scheduler or self.retry):
            raise EngineUnusable(
                f"every worker died, {len(self.retry) + self.scheduler.left()} requests left",
                self.group.broken.get(a, "unknown"),
            )

    def _result(self, a: int, ref: ObjectRef[tuple[WorkResult[RowT], set[Key]]]) -> tuple[WorkResult[RowT], set[Key]]:
        """The call's result and the keys the actor still holds; an actor dead for good gives nothing, and
        the others take over its requests."""
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(ref)
        except (RayActorError, WorkerDead) as exc:
            broken = self.group.broken[a] = error_line(exc)
            log.error("worker actor %d died (%s); %d requests go to the others", a, broken, len(self.outstanding[a]))
            self.alive.discard(a)
            ray.kill(self.group.actors[a])  # a worker that declared itself dead still holds its resources
            return WorkResult[RowT](), set()

    def _check_progress(self, a: int, result: WorkResult[RowT]) -> None:
        """Raise :class:`Stalled` when ``a`` holds requests and finished none for the progress timeout."""
        if result.keys() or not self.outstanding[a]:
            self.progress[a] = time.monotonic()
        elif time.monotonic() - self.progress[a] > self.group.progress_timeout_s:
            raise Stalled(
                f"worker {a} finished none of its {len(self.outstanding[a])} requests for "
                f"{self.group.progress_timeout_s:g} s (execution.progress_timeout_s)",
                self.group.broken.get(a, "no row, no failure and no error from its engine"),
            )
