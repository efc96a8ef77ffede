"""Knowledge generation on Ray: actors that hold the model, the decoder and an LRU of pools.

Each actor runs the continuous engine in a background thread: up to ``slots`` requests decode together
(rows of different pools share a batch, each drafting from its own pool), a finished request leaves at
once and a waiting one takes its slot. The driver streams requests to every actor with pool affinity
(chunks of one pool key, so an actor loads few pools), keeps each actor's queue ahead of its slots, and
writes the rows into a :class:`~pipelines.knowledge_store.KnowledgeWriter` as they come back, under a
progress bar. A request that fails (prompt too long, bad item, decoder error) becomes a failure record;
it never takes down the others. Local Ray is started in-process when no address is configured.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from tqdm.auto import tqdm

from pipelines.interrupts import ray_wait
from pipelines.knowledge_store import KnowledgeWriter, encode_params, utc_now
from pipelines.knowledge.prompts import item_prompt, user_prompt, words_for_budget
from pipelines.quality import (GREEDY_RETRY_DECODER, QualitySummary, entity_quality, quality_columns,
                                         row_quality, text_quality)
from pipelines.knowledge.retry import retry_once, task_rules
from pipelines.knowledge.sampling import encode_sampling, entity_sampling

log = logging.getLogger(__name__)

ACTOR_RESTARTS = 3  # restarts of a generation actor whose process died, and retries of its in-flight batch


@dataclass
class GenerationRequest:
    """One entity to write knowledge for. Users carry ``history`` ((title, rating) oldest first), items
    carry ``item`` (a row of the items table). ``pool_key`` None means no drafting pool."""

    entity_type: str
    entity_id: str
    pool_key: str | None = None
    pool_kind: str | None = None
    group_id: str | None = None
    history: list[tuple[str, float]] | None = None
    item: dict[str, Any] | None = None
    source_hash: str | None = None  # what the knowledge is generated from (pipelines.ops.schedule.source_hash)


@dataclass(frozen=True)
class ModelSpec:
    """What an actor loads once: the model, its dtype, the torch threads (= Ray CPUs) and the Ray GPUs
    (a fraction shares one GPU) it uses."""

    model: str
    dtype: str = "auto"
    threads: int = 1
    seed: int = 0
    gpus: float = 0.0

    @property
    def device(self) -> str:
        """Where the model runs: the GPU Ray assigns when the actor reserves GPUs, else the CPU."""
        return "cuda" if self.gpus > 0 else "cpu"


def actor_options(spec: ModelSpec) -> dict[str, float]:
    """The Ray resources one generation actor reserves."""
    return {"num_cpus": spec.threads, "num_gpus": spec.gpus}


@dataclass
class DecodeTask:
    """How one generation pass decodes: decoder, limits, prompt domain, pools and provenance (picklable)."""

    decoder: str
    decoder_params: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 256
    max_prompt_tokens: int | None = 1024
    domain: str = "movie"
    prompt_version: str = ""
    run_id: str = ""
    pool_store: str | None = None
    pool_cache_size: int = 8
    degenerate: str = "keep"  # retry | keep | retry_greedy | fail (pipelines/quality.py)
    sampling: dict[str, Any] | None = None  # temperature, top_p, top_k, seed; None = greedy (pipelines/knowledge/sampling.py)
    rules: dict[str, Any] | None = None  # laser.GenerationRules keywords (repetition penalty, stop strings, ...)
    retry_rules: dict[str, Any] | None = None  # the rules of the ``retry`` policy's second attempt


@dataclass
class BatchResult:
    """Rows (knowledge schema) and failures ({entity_type, entity_id, reason}) of one batch."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    decode_s: float = 0.0  # the actor's decoding seconds for these rows (shared steps counted once)

    def merge(self, other: "BatchResult") -> None:
        self.rows += other.rows
        self.failures += other.failures
        self.decode_s += other.decode_s


class GenerationWorker:
    """Holds one model; builds decoders on demand and generates knowledge for batches of requests.

    Used as a Ray actor (see :class:`WorkerGroup`) and directly in-process by tests and tools. The same
    actor serves every pass of a job (old and new knowledge), so the model is loaded once.
    """

    def __init__(self, spec: ModelSpec) -> None:
        import torch

        import laser

        torch.set_num_threads(spec.threads)
        torch.manual_seed(spec.seed)
        if spec.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"execution.gpus_per_worker={spec.gpus} but this node has no usable CUDA GPU")
        self.lm = laser.load_model(spec.model, device=spec.device, dtype=spec.dtype)
        self._decoders: dict[str, tuple[Any, str]] = {}
        self._pools: OrderedDict[str, Any] = OrderedDict()
        self._store: Any = None
        self.pool_loads = 0
        self._lock = threading.Lock()
        self._inbox: deque[tuple[DecodeTask, GenerationRequest]] = deque()
        self._outbox: queue.Queue[BatchResult] = queue.Queue()
        self._held: set[tuple[str, str]] = set()
        self._worker: threading.Thread | None = None

    def _decoder(self, task: DecodeTask) -> tuple[Any, str]:
        """(decoder, its parameters as JSON) for ``task``, built once per distinct setting."""
        import laser

        key = f"{task.decoder}:{encode_params(task.decoder_params)}"
        if key not in self._decoders:
            dec = laser.get_decoder(task.decoder, self.lm, **task.decoder_params)
            self._decoders[key] = (dec, encode_params(dec.params()))
        return self._decoders[key]

    def _pool(self, task: DecodeTask, key: str | None) -> Any:
        """The pool for ``key`` from the LRU, loaded from the task's pool store on a miss (None: no pool)."""
        if key is None:
            return None
        if self._store is None or str(self._store.directory) != str(task.pool_store):
            if task.pool_store is None:
                raise ValueError(f"request needs pool {key!r} but the task has no pool store")
            from pools.store import PoolStore

            self._store = PoolStore.open(task.pool_store, tokenizer=self.lm.tokenizer)
            self._pools.clear()
        if key in self._pools:
            self._pools.move_to_end(key)
            return self._pools[key]
        if key not in self._store:  # a group without old knowledge has no pool: decode without drafts
            return None
        pool = self._store.get(key)
        self.pool_loads += 1
        self._pools[key] = pool
        while len(self._pools) > task.pool_cache_size:
            evicted, _ = self._pools.popitem(last=False)
            self._store.release(evicted)
        return pool

    def prompt(self, task: DecodeTask, req: GenerationRequest) -> str:
        """The chat message for ``req`` (user histories truncated to ``max_prompt_tokens``)."""
        words = words_for_budget(task.max_new_tokens)
        if req.entity_type == "user":
            return user_prompt(req.history or [], task.domain, user_id=req.entity_id,
                               tokenizer=self.lm.tokenizer, max_prompt_tokens=task.max_prompt_tokens, max_words=words)
        if req.entity_type == "item":
            return item_prompt(req.item or {"item_id": req.entity_id}, task.domain, max_words=words)
        raise ValueError(f"unknown entity_type {req.entity_type!r}")

    def _row(self, task: DecodeTask, req: GenerationRequest, pool: Any, res: Any, params_json: str,
             sampling: Any = None) -> dict[str, Any]:
        st = res.stats
        sampling = sampling or entity_sampling(task.sampling, req.entity_type, req.entity_id)
        q = entity_quality(res.text, st.finish_reason, req.entity_type, req.history, req.item,
                           words_for_budget(task.max_new_tokens))
        return {
            "entity_type": req.entity_type, "entity_id": req.entity_id, "knowledge": res.text,
            "model": self.lm.name, "decoder": task.decoder, "decoder_params": params_json,
            "prompt_version": task.prompt_version, "pool_kind": req.pool_kind if pool is not None else None,
            "group_id": req.group_id if pool is not None else None, "n_tokens": len(res.token_ids),
            "target_forwards": int(st.target_forwards), "accepted_tokens": int(sum(st.accepted_per_step)),
            "retrieval_s": float(st.retrieval_s), "generation_s": float(st.prefill_s + st.decode_s),
            "finish_reason": st.finish_reason, "run_id": task.run_id, "generated_at": utc_now(),
            **quality_columns(q), "greedy_retry": False, "prefill_s": float(st.prefill_s), "decode_s": float(st.decode_s),
            "source_hash": req.source_hash, "sampling": encode_sampling(sampling),
        }

    def _apply_policy(self, task: DecodeTask, req: GenerationRequest, prompt: str,
                      row: dict[str, Any]) -> dict[str, Any]:
        """Apply ``task.degenerate`` to a degenerate row: keep it flagged, regenerate it greedily (kept,
        flagged, when still degenerate), or raise so that it becomes a failure."""
        if task.degenerate == "retry":
            return retry_once(self, task, req, prompt, row)
        if not row["degenerate"] or task.degenerate == "keep":
            return row
        reason = text_quality(row["knowledge"], row["finish_reason"]).reason()
        if task.degenerate == "fail":
            raise DegenerateTextError(reason)
        log.info("%s %s: %s; regenerating with %s", req.entity_type, req.entity_id, reason, GREEDY_RETRY_DECODER)
        greedy = DecodeTask(**{**task.__dict__, "decoder": GREEDY_RETRY_DECODER, "decoder_params": {}, "sampling": None})
        decoder, params_json = self._decoder(greedy)
        res = decoder.generate(prompt, task.max_new_tokens, None, rules=task_rules(task.rules))
        return {**self._row(greedy, req, None, res, params_json), "greedy_retry": True}

    def generate(self, task: DecodeTask, requests: list[GenerationRequest], slots: int | None = None) -> BatchResult:
        """Rows for the requests that succeed, a failure record (with the reason) for each that does not,
        decoded continuously in ``slots`` rows (default: all at once), in this thread."""
        waiting = deque(requests)
        out = BatchResult()
        for part in self._serve(task, lambda n: [waiting.popleft() for _ in range(min(n, len(waiting)))],
                                slots or max(1, len(requests))):
            out.merge(part)
        return out

    def _serve(self, task: DecodeTask, take: Callable[[int], list[GenerationRequest]], slots: int) -> Iterator[BatchResult]:
        """Decode requests pulled from ``take(n)`` through the engine; yield each one's result as it finishes.

        A request whose prompt or pool cannot be made fails alone. If the engine fails mid-stream, the
        requests it held are decoded one by one (so a bad entity fails by itself) and the stream goes on.
        """
        from laser.engine import TREE_ROOM

        decoder, params_json = self._decoder(task)
        held: dict[int, tuple[GenerationRequest, str, Any]] = {}  # engine request id -> what made it
        failed: list[dict[str, str]] = []
        capacity = (task.max_prompt_tokens or self.lm.context_length) + task.max_new_tokens + TREE_ROOM

        def admit(n: int) -> list[Any]:
            made: list[Any] = []
            while len(made) < n:
                got = take(n - len(made))
                if not got:
                    break
                for req in got:
                    try:
                        prompt, pool = self.prompt(task, req), self._pool(task, req.pool_key)
                        r = decoder.request(decoder.encode(prompt), task.max_new_tokens, pool,
                                            sampling=entity_sampling(task.sampling, req.entity_type, req.entity_id),
                                            rules=task_rules(task.rules))
                    except Exception as exc:  # one bad entity never takes down the others
                        failed.append(_failure(req, exc))
                        continue
                    held[id(r)] = (req, prompt, pool)
                    made.append(r)
            return made

        spent = decoder.engine.log.decode_s
        while True:
            try:
                for r in decoder.engine.stream(admit, slots, capacity):
                    req, prompt, pool = held.pop(id(r))
                    part = self._finish(task, req, prompt, pool, decoder.result(r), params_json)
                    part.decode_s += decoder.engine.log.decode_s - spent  # shared steps once, plus any retry
                    spent = decoder.engine.log.decode_s
                    part.failures[:0], failed[:] = failed, []
                    yield part
                break
            except Exception as exc:
                log.warning("decoding %d requests together failed (%s); decoding them one by one", len(held), exc)
                stranded, spent = list(held.values()), decoder.engine.log.decode_s
                held.clear()
                for req, prompt, pool in stranded:
                    yield self._alone(task, decoder, params_json, req, prompt, pool)
        if failed:
            yield BatchResult(failures=failed)

    def _alone(self, task: DecodeTask, decoder: Any, params_json: str, req: GenerationRequest, prompt: str,
               pool: Any) -> BatchResult:
        sampling = entity_sampling(task.sampling, req.entity_type, req.entity_id)
        try:  # greedy calls stay valid for decoders whose generate takes no `sampling`
            kw = {} if sampling.greedy else {"sampling": sampling}
            res = decoder.generate(prompt, task.max_new_tokens, pool, rules=task_rules(task.rules), **kw)
        except Exception as exc:
            return BatchResult(failures=[_failure(req, exc)])
        out = self._finish(task, req, prompt, pool, res, params_json)
        out.decode_s += res.stats.decode_s
        return out

    def _finish(self, task: DecodeTask, req: GenerationRequest, prompt: str, pool: Any, res: Any,
                params_json: str) -> BatchResult:
        """The row of one finished generation, after the degenerate-text policy (or its failure)."""
        try:
            row = self._apply_policy(task, req, prompt, self._row(task, req, pool, res, params_json))
        except Exception as exc:
            return BatchResult(failures=[_failure(req, exc)])
        return BatchResult(rows=[row], decode_s=row["decode_s"] if row["greedy_retry"] else 0.0)

    # ---- streaming service (the Ray actor's side) ----------------------------------------------

    def exchange(self, task: DecodeTask, requests: list[GenerationRequest], slots: int,
                 wait_s: float = 0.5) -> tuple[BatchResult, set[tuple[str, str]]]:
        """Queue ``requests`` for the background decoder, wait up to ``wait_s`` for finished ones, and return
        them with the keys of every request this actor still holds (queued or decoding). The driver calls
        it once at a time per actor; a key it sent that is neither returned nor held was lost (restart)."""
        with self._lock:
            for req in requests:
                self._inbox.append((task, req))
                self._held.add(_key(req))
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._decode_loop, args=(slots,), daemon=True)
                self._worker.start()
        out = BatchResult()
        try:
            out.merge(self._outbox.get(timeout=wait_s))
            while True:
                out.merge(self._outbox.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            for key in [(r["entity_type"], r["entity_id"]) for r in out.rows] + \
                       [(f["entity_type"], f["entity_id"]) for f in out.failures]:
                self._held.discard(key)
            return out, set(self._held)

    def _decode_loop(self, slots: int) -> None:
        """Background thread: serve the inbox task by task (passes never mix in one engine stream)."""
        while True:
            with self._lock:
                if not self._inbox:
                    self._worker = None
                    return
                task = self._inbox[0][0]

            def take(n: int) -> list[GenerationRequest]:
                with self._lock:
                    got = []
                    while self._inbox and len(got) < n and self._inbox[0][0] == task:
                        got.append(self._inbox.popleft()[1])
                    return got

            for part in self._serve(task, take, slots):
                self._outbox.put(part)


def _key(req: GenerationRequest) -> tuple[str, str]:
    return req.entity_type, req.entity_id


class DegenerateTextError(ValueError):
    """A generated text is degenerate and the policy sends it to failures."""


def _failure(req: GenerationRequest, exc: Exception) -> dict[str, str]:
    log.warning("%s %s failed: %s", req.entity_type, req.entity_id, exc)
    return {"entity_type": req.entity_type, "entity_id": req.entity_id, "reason": f"{type(exc).__name__}: {exc}"}


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
    from pipelines.interrupts import reassert

    reassert()  # ray.init replaced the SIGTERM handler of an interruptible job


def make_batches(requests: Iterable[GenerationRequest], batch_size: int) -> dict[str | None, deque[list[GenerationRequest]]]:
    """Requests grouped by pool key (keys and entities in sorted order), cut into batches."""
    by_key: dict[str | None, list[GenerationRequest]] = defaultdict(list)
    for req in requests:
        by_key[req.pool_key].append(req)
    out: dict[str | None, deque[list[GenerationRequest]]] = {}
    for key in sorted(by_key, key=lambda k: (k is None, k or "")):
        reqs = sorted(by_key[key], key=lambda r: (r.entity_type, r.entity_id))
        out[key] = deque(reqs[i:i + batch_size] for i in range(0, len(reqs), batch_size))
    return out


class BatchScheduler:
    """Hands out batches with pool affinity: an actor keeps its last pool key while that key has work;
    otherwise it takes the key with the most batches left that no other actor is on."""

    def __init__(self, batches: dict[str | None, deque[list[GenerationRequest]]]) -> None:
        self.batches = {k: q for k, q in batches.items() if q}
        self.last: dict[int, str | None] = {}

    def __bool__(self) -> bool:
        return bool(self.batches)

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


@dataclass
class GenerationReport:
    """What one generation pass did (for the closing summary)."""

    done: int = 0
    failed: int = 0
    n_tokens: int = 0
    target_forwards: int = 0
    accepted_tokens: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0  # summed over rows
    decode_s: float = 0.0  # actors' decoding seconds, summed over batches (a batch's shared steps once)
    greedy_retries: int = 0
    quality: QualitySummary = field(default_factory=QualitySummary)

    @property
    def aal(self) -> float:
        """Tokens per decoding forward: (accepted draft tokens + forwards) / forwards."""
        return (self.accepted_tokens + self.target_forwards) / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Wall throughput: generated tokens / seconds of the pass, which includes actor start-up and model
        load, pool loads, prompt building, prefill, decoding and writing."""
        return self.n_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode-only throughput: generated tokens / actor decoding seconds (a batch counts its longest row's
        decoding time; prefill, model and pool loads excluded). Actors run in parallel, so wall throughput
        can exceed it when prefill is small."""
        return self.n_tokens / self.decode_s if self.decode_s else 0.0


class WorkerGroup:
    """``num_workers`` generation actors sharing one model spec; serves several passes, then ``close``."""

    worker_cls: type = GenerationWorker  # the actor class (tests may probe scheduling with a lighter one)

    def __init__(self, spec: ModelSpec, num_workers: int, address: str | None = None) -> None:
        self.spec, self.num_workers, self.address = spec, num_workers, address
        self.actors: list[Any] = []

    def _start(self, n: int) -> None:
        import ray

        ensure_ray(self.address, num_cpus=self.num_workers * self.spec.threads)
        if len(self.actors) < n:
            log.info("starting %d generation worker(s); each loads %s once (about 30 s the first time, while the "
                     "bundled model is de-quantised and cached; a few seconds after)", n - len(self.actors),
                     self.spec.model)
        # a killed worker process is restarted (the model reloads) and its in-flight batch re-run; rows are
        # written by the driver from returned results only, so a retried batch is never written twice
        remote_cls = ray.remote(self.worker_cls).options(**actor_options(self.spec), max_restarts=ACTOR_RESTARTS,
                                                         max_task_retries=ACTOR_RESTARTS)
        while len(self.actors) < n:
            self.actors.append(remote_cls.remote(self.spec))

    def run(self, requests: list[GenerationRequest], task: DecodeTask, writer: KnowledgeWriter, *,
            slots: int, desc: str = "knowledge") -> GenerationReport:
        """Generate knowledge for ``requests`` with ``slots`` in flight per actor, streaming rows and failures
        to ``writer`` as requests finish.

        Each actor gets one :meth:`GenerationWorker.exchange` call at a time: new requests (chunks of one
        pool key, enough to keep its queue ``slots // 2`` ahead of its slots) in, finished rows out. A
        request an actor lost (its process died and Ray restarted it) is sent again, up to
        ``ACTOR_RESTARTS`` times; an actor that stays dead hands its requests to the others.
        """
        report = GenerationReport()
        if not requests:
            return report
        import ray
        from ray.exceptions import RayActorError

        start = time.perf_counter()
        self._start(min(self.num_workers, len(requests)))
        chunk = max(1, slots // 2)
        scheduler = BatchScheduler(make_batches(requests, chunk))
        outstanding: list[dict[tuple[str, str], GenerationRequest]] = [{} for _ in self.actors]
        retry: deque[GenerationRequest] = deque()
        losses: Counter[tuple[str, str]] = Counter()
        alive = set(range(len(self.actors)))
        calls: dict[Any, int] = {}

        def call(a: int) -> None:
            new: list[GenerationRequest] = []
            while retry and len(outstanding[a]) + len(new) < slots + chunk:
                new.append(retry.popleft())
            while scheduler and len(outstanding[a]) + len(new) < slots + chunk:
                new += scheduler.next_for(a)
            for req in new:
                outstanding[a][_key(req)] = req
            if outstanding[a]:
                calls[self.actors[a].exchange.remote(task, new, slots)] = a

        with tqdm(total=len(requests), desc=desc, unit="entity") as bar:
            for a in alive:
                call(a)
            while calls:
                ready, _ = ray_wait(list(calls), num_returns=1, timeout=0.5)  # short: signals get handled
                if not ready:
                    continue
                [ref] = ready
                a = calls.pop(ref)
                try:
                    result, held = ray.get(ref)
                except RayActorError as exc:  # dead beyond its restarts: the others take over its requests
                    log.error("generation actor %d died (%s); %d requests go to the others", a, exc, len(outstanding[a]))
                    result, held = BatchResult(), set()
                    alive.discard(a)
                done = [(r["entity_type"], r["entity_id"]) for r in result.rows] + \
                       [(f["entity_type"], f["entity_id"]) for f in result.failures]
                for key in done:
                    outstanding[a].pop(key, None)
                for key in [k for k in outstanding[a] if k not in held]:  # lost with a dead process
                    req = outstanding[a].pop(key)
                    losses[key] += 1
                    if losses[key] > ACTOR_RESTARTS:
                        result.failures.append({"entity_type": key[0], "entity_id": key[1],
                                                "reason": f"worker died {losses[key]} times decoding it"})
                    else:
                        retry.append(req)
                _record(result, writer, report)
                bar.update(len(result.rows) + len(result.failures))
                for b in ([a] if a in alive else []) + [b for b in alive if b not in calls.values() and b != a]:
                    call(b)
                if not calls and (scheduler or retry):
                    raise RuntimeError(f"all generation actors died; {len(retry) + sum(map(len, scheduler.batches.values()))} "
                                       "requests left")
        writer.flush()
        report.wall_s = time.perf_counter() - start
        return report

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record(result: BatchResult, writer: KnowledgeWriter, report: GenerationReport) -> None:
    for row in result.rows:
        writer.add(row)
        report.n_tokens += row["n_tokens"]
        report.target_forwards += row["target_forwards"]
        report.accepted_tokens += row["accepted_tokens"]
        report.prefill_s += row.get("prefill_s") or 0.0
        report.greedy_retries += bool(row.get("greedy_retry"))
        report.quality.add(row_quality(row))
    report.decode_s += result.decode_s
    for f in result.failures:
        writer.add_failure(f["entity_type"], f["entity_id"], f["reason"])
    report.done += len(result.rows)
    report.failed += len(result.failures)
