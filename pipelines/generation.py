"""Knowledge generation on Ray: actors that hold the model, the decoder and an LRU of pools.

The driver groups requests by pool key into batches, hands each idle actor a batch of a pool it
already holds when there is one (so an actor loads few pools), and streams the results into a
:class:`~pipelines.knowledge.KnowledgeWriter` as they come back (``ray.wait``), under a progress bar.
An actor decodes each batch in one padded forward per step (``Decoder.generate_batch``). A request that
fails (prompt too long, bad item, decoder error) becomes a failure record; it never takes down its batch. Local Ray is started in-process when no address is configured.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from tqdm.auto import tqdm

from pipelines.knowledge import KnowledgeWriter, encode_params, utc_now
from pipelines.prompts import item_prompt, user_prompt, words_for_budget
from pipelines.quality import GREEDY_RETRY_DECODER, QualitySummary, TextQuality, text_quality

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
    source_hash: str | None = None  # what the knowledge is generated from (pipelines.schedule.source_hash)


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
    degenerate: str = "keep"  # keep | retry_greedy | fail (pipelines/quality.py)


@dataclass
class BatchResult:
    """Rows (knowledge schema) and failures ({entity_type, entity_id, reason}) of one batch."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    decode_s: float = 0.0  # the actor's decoding seconds for the batch (shared steps counted once)


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

    def _row(self, task: DecodeTask, req: GenerationRequest, pool: Any, res: Any, params_json: str) -> dict[str, Any]:
        st = res.stats
        q = text_quality(res.text, st.finish_reason)
        return {
            "entity_type": req.entity_type, "entity_id": req.entity_id, "knowledge": res.text,
            "model": self.lm.name, "decoder": task.decoder, "decoder_params": params_json,
            "prompt_version": task.prompt_version, "pool_kind": req.pool_kind if pool is not None else None,
            "group_id": req.group_id if pool is not None else None, "n_tokens": len(res.token_ids),
            "target_forwards": int(st.target_forwards), "accepted_tokens": int(sum(st.accepted_per_step)),
            "retrieval_s": float(st.retrieval_s), "generation_s": float(st.prefill_s + st.decode_s),
            "finish_reason": st.finish_reason, "run_id": task.run_id, "generated_at": utc_now(),
            "finished_eos": q.finished_eos, "repeat_4gram": q.repeat_4gram, "degenerate": q.degenerate,
            "greedy_retry": False, "prefill_s": float(st.prefill_s), "decode_s": float(st.decode_s),
            "source_hash": req.source_hash,
        }

    def _apply_policy(self, task: DecodeTask, req: GenerationRequest, prompt: str,
                      row: dict[str, Any]) -> dict[str, Any]:
        """Apply ``task.degenerate`` to a degenerate row: keep it flagged, regenerate it greedily (kept,
        flagged, when still degenerate), or raise so that it becomes a failure."""
        if not row["degenerate"] or task.degenerate == "keep":
            return row
        reason = text_quality(row["knowledge"], row["finish_reason"]).reason()
        if task.degenerate == "fail":
            raise DegenerateTextError(reason)
        log.info("%s %s: %s; regenerating with %s", req.entity_type, req.entity_id, reason, GREEDY_RETRY_DECODER)
        greedy = DecodeTask(**{**task.__dict__, "decoder": GREEDY_RETRY_DECODER, "decoder_params": {}})
        decoder, params_json = self._decoder(greedy)
        res = decoder.generate(prompt, task.max_new_tokens, None)
        return {**self._row(greedy, req, None, res, params_json), "greedy_retry": True}

    def generate(self, task: DecodeTask, requests: list[GenerationRequest]) -> BatchResult:
        """Rows for the requests that succeed, a failure record (with the reason) for each that does not.

        The requests whose prompt and pool are ready are decoded together in one padded batch; if that
        batch fails, each is retried alone so that a bad entity fails by itself.
        """
        out = BatchResult()
        ready: list[tuple[GenerationRequest, str, Any]] = []
        for req in requests:
            try:
                ready.append((req, self.prompt(task, req), self._pool(task, req.pool_key)))
            except Exception as exc:  # one bad entity never takes down the batch
                out.failures.append(_failure(req, exc))
        if not ready:
            return out
        decoder, params_json = self._decoder(task)
        try:
            gens = decoder.generate_batch([p for _, p, _ in ready], task.max_new_tokens, [pool for _, _, pool in ready])
        except Exception as exc:
            log.warning("batch of %d failed (%s); decoding one by one", len(ready), exc)
            gens = None
        if gens is not None:  # rows of a batch decode together: the batch took its longest row's time
            out.decode_s = max((g.stats.decode_s for g in gens), default=0.0)
        for i, (req, prompt, pool) in enumerate(ready):
            try:
                res = gens[i] if gens is not None else decoder.generate(prompt, task.max_new_tokens, pool)
                out.decode_s += res.stats.decode_s if gens is None else 0.0
                row = self._apply_policy(task, req, prompt, self._row(task, req, pool, res, params_json))
                out.decode_s += row["decode_s"] if row["greedy_retry"] else 0.0
                out.rows.append(row)
            except Exception as exc:
                out.failures.append(_failure(req, exc))
        return out


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
        # a killed worker process is restarted (the model reloads) and its in-flight batch re-run; rows are
        # written by the driver from returned results only, so a retried batch is never written twice
        remote_cls = ray.remote(self.worker_cls).options(**actor_options(self.spec), max_restarts=ACTOR_RESTARTS,
                                                         max_task_retries=ACTOR_RESTARTS)
        while len(self.actors) < n:
            self.actors.append(remote_cls.remote(self.spec))

    def run(self, requests: list[GenerationRequest], task: DecodeTask, writer: KnowledgeWriter, *,
            batch_size: int, desc: str = "knowledge") -> GenerationReport:
        """Generate knowledge for ``requests``, streaming rows and failures to ``writer`` as batches finish."""
        report = GenerationReport()
        if not requests:
            return report
        import ray
        from ray.exceptions import RayActorError

        start = time.perf_counter()
        self._start(min(self.num_workers, len(requests)))
        scheduler = BatchScheduler(make_batches(requests, batch_size))
        in_flight: dict[Any, tuple[int, list[GenerationRequest]]] = {}

        def dispatch(actor: int) -> None:
            batch = scheduler.next_for(actor)
            if batch is not None:
                in_flight[self.actors[actor].generate.remote(task, batch)] = (actor, batch)

        with tqdm(total=len(requests), desc=desc, unit="entity") as bar:
            for a in range(len(self.actors)):
                dispatch(a)
            while in_flight:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)  # short: signals get handled
                if not ready:
                    continue
                [ref] = ready
                actor, batch = in_flight.pop(ref)
                try:
                    result: BatchResult = ray.get(ref)
                except RayActorError as exc:  # the actor died (e.g. out of memory): record, go on without it
                    result = BatchResult(failures=[{"entity_type": r.entity_type, "entity_id": r.entity_id,
                                                    "reason": f"worker died: {exc}"} for r in batch])
                    log.error("generation actor %d died; %d requests recorded as failed", actor, len(batch))
                else:
                    dispatch(actor)
                _record(result, writer, report)
                bar.update(len(batch))
                if not in_flight and scheduler:
                    raise RuntimeError(f"all generation actors died; {sum(map(len, scheduler.batches.values()))} "
                                       "batches left")
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
        report.quality.add(TextQuality(row["finished_eos"], row["repeat_4gram"], row["degenerate"]))
    report.decode_s += result.decode_s
    for f in result.failures:
        writer.add_failure(f["entity_type"], f["entity_id"], f["reason"])
    report.done += len(result.rows)
    report.failed += len(result.failures)
