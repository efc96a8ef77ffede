"""vLLM (``execution.engine: vllm``) behind the knowledge worker's adapter protocol.

:class:`VllmAdapter` feeds one :class:`laser.vllm.VllmEngine` (LASER as its drafter). The actor holds the
tokenizer only (prompts, banned words); vLLM holds the one copy of the weights. Everything else is the
worker's skeleton: prompts, pools, rows, the degenerate-text policy, failure handling and accounting.

Every attempt is an ordinary vLLM request: the first decoding of an entity and the retry of a flawed
row alike (greedy, with the retry's rules in vLLM's form, :mod:`laser.vllm.forms`; a retry's
``no_repeat_ngram_size`` has none in vLLM 0.32 with speculation on and is left out), so a retry never
stalls the requests in flight. Requests are fed continuously: ``slots`` stay in vLLM, and each one that
finishes is replaced at once. A request drafts from its pool when it has one (vLLM's engine process
opens it from the pool store by the key and store path the request carries) and drafts nothing
otherwise, as on the ``hf`` engine.

An engine whose engine-core process died (:attr:`laser.vllm.VllmEngine.dead`) is started again once, and
the requests it held are handed to the new one; if it dies again, or cannot start again, the worker is
dead (:class:`~pipelines.workers.WorkerDead`): the driver hands its requests to the other actors.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from laser.decoders import available_decoders
from laser.request import DecodeStats
from laser.sampling import SamplingParams
from laser.vllm.engine import VllmEngine  # vLLM itself loads when an engine starts
from laser.vllm.results import VllmResult
from laser.vllm.request_args import DraftLen
from pipelines.knowledge.engines.base import EngineClock
from pipelines.knowledge.records import Attempt, DecodeTask, Finished, Params
from pipelines.workers import ModelSpec, WorkerDead, encode_params

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from laser.decoders.base import Decoder
    from pipelines.knowledge.pool_cache import PoolCache

log = logging.getLogger(__name__)

ENGINE_RESTARTS = 1  # starts of a new engine after the actor's engine died; one more death: the worker is dead


class VllmGeneration:
    """A :class:`laser.vllm.VllmResult` as a :class:`~pipelines.knowledge.records.Decoded`. The text is
    decoded from the tokens as on the ``hf`` engine (vLLM's incremental detokenizer holds back a trailing
    partial character)."""

    def __init__(self, res: VllmResult, tokenizer: PreTrainedTokenizerBase) -> None:
        self.token_ids = list(res.token_ids)
        self.text = str(tokenizer.decode(res.token_ids, skip_special_tokens=True))
        self.stats = DecodeStats(
            target_forwards=int(res.target_forwards),
            new_tokens=len(res.token_ids),
            accepted_per_step=list(res.accepted_per_step or []),
            finish_reason=res.finish_reason,
            prefill_s=_measured(res.prefill_s),
            decode_s=_measured(res.decode_s),
            retrieval_s=_measured(res.draft_s),
            prompt_tokens=res.prompt_tokens,
            cached_prompt_tokens=res.cached_prompt_tokens,
            own_accepted=res.own_accepted,
        )


def gpu_engine_args(spec: ModelSpec) -> dict[str, float]:
    """vLLM's GPU settings for an actor's engine: tensor parallel over the actor's whole GPUs, and memory
    within its share of each (``execution.gpu_memory_utilization``, default 0.9 of the share); none on CPU."""
    if spec.device != "cuda":
        return {}
    share = spec.gpu_memory_utilization or round(0.9 * min(spec.gpus, 1.0), 3)
    return {"tensor_parallel_size": max(1, int(spec.gpus)), "gpu_memory_utilization": share}


def model_engine_args(spec: ModelSpec) -> dict[str, Any]:
    """vLLM's keywords for the model as the job config gives it: revision, remote code, tokens per request
    (None: the model's own, cut to what the KV cache holds) and ``model.engine_args`` as they are."""
    pinned = {"revision": spec.revision, "tokenizer_revision": spec.revision} if spec.revision else {}
    return {
        **pinned,
        "trust_remote_code": spec.trust_remote_code,
        "max_model_len": spec.max_model_len,
        **spec.engine_args,
    }


def _measured(seconds: float | None) -> float:
    """A time vLLM measured; NaN (never a made-up 0) where it did not."""
    return float("nan") if seconds is None else float(seconds)


class VllmAdapter:
    """One vLLM engine per actor, built on the first pass and kept for the job; the actor loads the
    tokenizer only."""

    name = "vllm"

    def __init__(self, spec: ModelSpec) -> None:
        from laser.models import load_tokenizer

        self.spec = spec
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(spec.model, **spec.loading())
        self.model_name = spec.model
        self.engine: VllmEngine | None = None
        # vLLM request tag -> the attempt and its decoder parameters' JSON (the rows' column)
        self.live: dict[str, tuple[Attempt, str]] = {}
        self.seconds = 0.0  # wall seconds of every step
        self.draft_len: DraftLen | None = None
        self.restarts = 0
        self.dead_clock = EngineClock()  # decoding of engines that died
        self.registered: set[str] = set()  # the pools growing in this worker, registered with the engine

    def clock(self) -> EngineClock:
        seconds, tokens = (self.engine.decode_clock if self.engine is not None else None) or (0.0, 0)
        return EngineClock(self.seconds, seconds, tokens) + self.dead_clock

    def _engine(self, slots: int) -> VllmEngine:
        """The actor's engine, started on first use."""
        if self.engine is None:
            from laser.vllm.forms import MAX_DRAFT

            spec = self.spec
            dtype = spec.dtype if spec.dtype != "auto" or spec.device == "cuda" else "float32"
            more: dict[str, Any] = {**gpu_engine_args(spec), **model_engine_args(spec), **spec.engine_options}
            self.engine = VllmEngine(
                spec.model,
                speculation="laser",
                max_draft=MAX_DRAFT,
                draft_len=MAX_DRAFT,
                threads=spec.threads if spec.device == "cpu" else None,
                bind_threads=False,  # the node's other actors share its cores
                max_num_seqs=max(slots, 1),
                dtype=dtype,
                seed=spec.seed,
                enforce_eager=not spec.compile,
                pool_roots=spec.pool_roots,
                **more,
            )
        return self.engine

    def start(self, slots: int, task: DecodeTask | None = None, pools: PoolCache | None = None) -> dict[str, object]:
        engine = self._engine(slots)
        info: dict[str, object] = {"engine": "vllm", "engine_start_s": round(engine.start_seconds, 1)}
        if task is None or pools is None:
            return info
        from laser.vllm.forms import draft_length

        self.task, self.slots, self.pools = task, slots, pools
        if engine.in_flight or self.live:  # left by a pass that broke off
            self.abort()
        want = draft_length(self._settings(task.decoder, task.decoder_params)[1])
        if want != self.draft_len:
            engine.set_draft_len(want)
            self.draft_len = want
        return info

    @staticmethod
    def _settings(decoder: str, params: Params) -> tuple[type[Decoder], dict[str, object]]:
        cls = available_decoders()[decoder]
        return cls, cls.settings(dict(params))

    def submit(self, attempt: Attempt) -> None:
        try:
            self._submit(attempt)
        except Exception as exc:
            if not self._died():
                raise
            self._restart(exc)
            self._submit(attempt)

    def _submit(self, attempt: Attempt) -> None:
        from laser.vllm.forms import decoder_options, with_vllm_form

        cls, settings = self._settings(attempt.decoder, attempt.params)
        opts = decoder_options(cls, settings, pooled=attempt.pool_key is not None)
        rules = dict(attempt.rules) if attempt.rules else None
        if attempt.first is not None:  # a retry's stronger rules: those with no vLLM form are left out
            rules = with_vllm_form(rules)
        engine: VllmEngine = self._engine(self.slots)
        pool_key, pool_store = self._pool(engine, attempt.pool_key) if opts["draft"] else (None, None)
        tag = engine.submit(
            attempt.prompt,
            self.task.max_new_tokens,
            sampling=_sampling(attempt.sampling),
            pool_key=pool_key,
            pool_store=pool_store,
            rules=rules,
            halt=attempt.halt(),
            earlier=attempt.earlier,
            **opts,
        )
        self.live[tag] = attempt, encode_params(settings)

    def _pool(self, engine: VllmEngine, key: str | None) -> tuple[str | None, str | None]:
        """The pool key and store a request of group ``key`` names: the task's store, or a pool growing in
        this worker, registered with the engine under a key of the run's own (none where the engine core
        runs in another process and cannot see it)."""
        if key is None or not self.pools.is_online(self.task, key):
            return key, self.task.pool_store if key is not None else None
        if engine.proposer is None:
            return None, None
        online = f"online:{self.task.run_id}:{key}"
        if online not in self.registered:
            engine.register_pool(online, self.pools.get(self.task, key))  # type: ignore[arg-type]  # is_online
            self.registered.add(online)
        return online, None

    def _step(self) -> list[tuple[str, VllmResult]]:
        t0 = time.perf_counter()
        try:
            return self._engine(self.slots).step()
        except Exception as exc:
            if not self._died():
                raise
            self._restart(exc)  # what it held now runs on the new engine
            return []
        finally:
            self.seconds += time.perf_counter() - t0

    def _died(self) -> bool:
        """Whether the last error came from an engine whose engine core is gone (not from one request)."""
        return self.engine is not None and self.engine.dead

    def _restart(self, exc: Exception) -> None:
        """A new engine in place of the dead one, the attempts it held submitted to it; raises
        :class:`WorkerDead` past :data:`ENGINE_RESTARTS` or when the new engine cannot start."""
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if self.restarts >= ENGINE_RESTARTS:
            raise WorkerDead(f"the vLLM engine died again after {self.restarts} restart(s): {reason}") from exc
        self.restarts += 1
        log.error("the vLLM engine died (%s); starting a new one for its %d requests", reason, len(self.live))
        held, old = [attempt for attempt, _ in self.live.values()], self.engine
        if old is not None:
            self.dead_clock += EngineClock(0.0, *(old.decode_clock or (0.0, 0)))
            old.close()
        self.engine, self.draft_len, self.live = None, None, {}
        try:
            self.start(self.slots, self.task, self.pools)
        except Exception as err:
            raise WorkerDead(f"the vLLM engine died ({reason}) and could not start again: {err}") from err
        for attempt in held:
            self._submit(attempt)

    def step(self) -> list[Finished]:
        finished = []
        for tag, res in self._step():
            attempt, params = self.live.pop(tag)
            finished.append(Finished(attempt, VllmGeneration(res, self.tokenizer), params))
        return finished

    def abort(self) -> None:
        self.live.clear()
        if self.engine is None:
            return
        try:
            self.engine.abort_all()
        except Exception as exc:
            if not self._died():
                raise
            self._restart(exc)


def _sampling(sampling: SamplingParams) -> dict[str, float] | None:
    if sampling.greedy:
        return None
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
    }
