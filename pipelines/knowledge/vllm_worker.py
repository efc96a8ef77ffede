"""Knowledge generation on vLLM (``execution.engine: vllm``): the serve skeleton with a vLLM adapter.

:class:`VllmGenerationWorker` is a :class:`~pipelines.knowledge.generation.GenerationWorker` whose engine
adapter feeds one :class:`laser.vllm.VllmEngine` (LASER as its drafter). The actor holds the tokenizer
only (prompts, banned words); vLLM holds the one copy of the weights. Everything else is the skeleton's:
prompts, pools, rows, the degenerate-text policy, failure handling and accounting.

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
from typing import Any, Callable, ClassVar, Iterator

from laser.decoders import available_decoders
from laser.request import DecodeStats
from pipelines.knowledge.generation import Attempt, DecodeTask, EngineAdapter, EngineClock, GenerationWorker
from pipelines.knowledge_store import encode_params
from pipelines.workers import ModelSpec, WorkerDead

log = logging.getLogger(__name__)

ENGINE_RESTARTS = 1  # starts of a new engine after the actor's engine died; one more death: the worker is dead


class VllmGeneration:
    """A :class:`laser.vllm.VllmResult` shaped like a decoder's generation (``text``, ``token_ids``,
    ``stats``) for the skeleton's row builder. The text is decoded from the tokens as on the ``hf``
    engine (vLLM's incremental detokenizer holds back a trailing partial character)."""

    def __init__(self, res: Any, tokenizer: Any):
        self.token_ids = res.token_ids
        self.text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        self.stats = DecodeStats(target_forwards=int(res.target_forwards), new_tokens=len(res.token_ids),
                                 accepted_per_step=list(res.accepted_per_step or []), finish_reason=res.finish_reason,
                                 prefill_s=_measured(res.prefill_s), decode_s=_measured(res.decode_s),
                                 retrieval_s=_measured(res.draft_s), prompt_tokens=res.prompt_tokens,
                                 cached_prompt_tokens=res.cached_prompt_tokens,
                                 own_accepted=getattr(res, "own_accepted", None))


def gpu_engine_args(spec: ModelSpec) -> dict[str, Any]:
    """vLLM's GPU settings for an actor's engine: tensor parallel over the actor's whole GPUs, and memory
    within its share of each (``execution.gpu_memory_utilization``, default 0.9 of the share); none on CPU."""
    if spec.device != "cuda":
        return {}
    share = spec.gpu_memory_utilization or round(0.9 * min(spec.gpus, 1.0), 3)
    return {"tensor_parallel_size": max(1, int(spec.gpus)), "gpu_memory_utilization": share}


def _measured(seconds: float | None) -> float:
    """A time vLLM measured; NaN (never a made-up 0) where it did not."""
    return float("nan") if seconds is None else float(seconds)


class VllmAdapter(EngineAdapter):
    """One vLLM engine per actor, built on the first pass and kept for the job."""

    name = "vllm"
    engine_options: ClassVar[dict[str, Any]] = {}  # more VllmEngine keywords (tests: in_process=False)

    def __init__(self, worker: "VllmGenerationWorker") -> None:
        self.worker = worker
        self.engine: Any = None
        self.live: dict[str, Attempt] = {}  # vLLM request tag -> attempt
        self.seconds = 0.0  # wall seconds of every step
        self.draft_len: Any = None
        self.restarts = 0
        self.dead_clock = (0.0, 0)  # decoding (seconds, tokens) of engines that died

    def clock(self) -> EngineClock:
        decoding = (self.engine.decode_clock if self.engine is not None else None) or (0.0, 0)
        return EngineClock(self.seconds, decoding[0] + self.dead_clock[0], decoding[1] + self.dead_clock[1])

    def ready(self, slots: int) -> dict[str, Any]:
        from laser.vllm import VllmEngine
        from laser.vllm.forms import MAX_DRAFT

        if self.engine is None:
            spec = self.worker.spec
            dtype = spec.dtype if spec.dtype != "auto" or spec.device == "cuda" else "float32"
            self.engine = VllmEngine(spec.model, speculation="laser", max_draft=MAX_DRAFT, draft_len=MAX_DRAFT,
                                     threads=spec.threads if spec.device == "cpu" else None,
                                     bind_threads=False,  # the node's other actors share its cores
                                     max_num_seqs=max(slots, 1), dtype=dtype, seed=spec.seed,
                                     enforce_eager=not spec.compile, **gpu_engine_args(spec), **self.engine_options)
        return {"engine": "vllm", "engine_start_s": round(self.engine.start_seconds, 1)}

    def start(self, task: DecodeTask, slots: int) -> None:
        from laser.vllm.forms import draft_length

        self.task, self.slots = task, slots
        self.ready(slots)
        if self.engine.in_flight or self.live:  # left by a pass that broke off
            self.abort()
        want = draft_length(self._settings(task.decoder, task.decoder_params)[1])
        if want != self.draft_len:
            self.engine.set_draft_len(want)
            self.draft_len = want

    @staticmethod
    def _settings(decoder: str, params: dict[str, Any]) -> tuple[type, dict[str, Any]]:
        cls = available_decoders()[decoder]
        return cls, cls.settings(params)

    def joins(self, attempt: Attempt) -> bool:
        return True  # every decoder and rule of a vLLM job is a per-request setting

    def make(self, attempt: Attempt) -> str:
        try:
            return self._submit(attempt)
        except Exception as exc:
            if not self._died(exc):
                raise
            self._restart(exc)
            return self._submit(attempt)

    def _submit(self, attempt: Attempt) -> str:
        from laser.vllm.forms import decoder_options, with_vllm_form

        cls, settings = self._settings(attempt.decoder, attempt.params)
        opts = decoder_options(cls, settings, pooled=attempt.pool_key is not None)
        rules = attempt.rules
        if attempt.first is not None:  # a retry's stronger rules: those with no vLLM form are left out
            rules = with_vllm_form(rules)
        tag = self.engine.submit(attempt.prompt, self.task.max_new_tokens, sampling=_sampling(attempt.sampling),
                                 pool_key=attempt.pool_key if opts["draft"] else None,
                                 pool_store=self.task.pool_store if opts["draft"] else None, rules=rules,
                                 halt=self.worker.halt(attempt), earlier=attempt.earlier, **opts)
        self.live[tag] = attempt
        return tag

    def _step(self) -> list[tuple[str, Any]]:
        t0 = time.perf_counter()
        try:
            return self.engine.step()
        except Exception as exc:
            if not self._died(exc):
                raise
            self._restart(exc)  # what it held now runs on the new engine
            return []
        finally:
            self.seconds += time.perf_counter() - t0

    def _died(self, exc: Exception) -> bool:
        """Whether ``exc`` came from an engine whose engine core is gone (not from one request)."""
        return self.engine is not None and self.engine.dead

    def _restart(self, exc: Exception) -> None:
        """A new engine in place of the dead one, the attempts it held submitted to it; raises
        :class:`WorkerDead` past :data:`ENGINE_RESTARTS` or when the new engine cannot start."""
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if self.restarts >= ENGINE_RESTARTS:
            raise WorkerDead(f"the vLLM engine died again after {self.restarts} restart(s): {reason}") from exc
        self.restarts += 1
        log.error("the vLLM engine died (%s); starting a new one for its %d requests", reason, len(self.live))
        held, old = list(self.live.values()), self.engine
        decoding = old.decode_clock or (0.0, 0)
        self.dead_clock = (self.dead_clock[0] + decoding[0], self.dead_clock[1] + decoding[1])
        self.engine, self.draft_len, self.live = None, None, {}
        old.close()
        try:
            self.start(self.task, self.slots)
        except Exception as err:
            raise WorkerDead(f"the vLLM engine died ({reason}) and could not start again: {err}") from err
        for attempt in held:
            self._submit(attempt)

    def stream(self, admit: Callable[[int], list[Any]], slots: int) -> Iterator[tuple[Attempt, Any]]:
        while True:
            admit(slots - len(self.live))
            if not self.live:
                return
            for tag, res in self._step():
                yield self.live.pop(tag), VllmGeneration(res, self.worker.lm.tokenizer)

    def alone(self, attempt: Attempt) -> Any:
        self.make(attempt)
        try:
            while True:
                for done, res in self._step():  # nothing else is in flight (after abort)
                    if self.live.pop(done, None) is attempt:  # its tag changes if the engine restarts
                        return VllmGeneration(res, self.worker.lm.tokenizer)
        except WorkerDead:
            raise
        except Exception:
            self.abort()
            raise

    def abort(self) -> None:
        self.live.clear()
        if self.engine is None:
            return
        try:
            self.engine.abort_all()
        except Exception as exc:
            if not self._died(exc):
                raise
            self._restart(exc)

    @property
    def in_flight(self) -> int:
        return len(self.live)

    def params_json(self, decoder: str, params: dict[str, Any]) -> str:
        return encode_params(self._settings(decoder, params)[1])


class VllmGenerationWorker(GenerationWorker):
    """A knowledge worker actor whose decoding runs on vLLM (see the module docstring)."""

    adapter_cls = VllmAdapter

    def load(self, spec: ModelSpec) -> Any:
        from laser.models import LoadedModel, load_tokenizer

        return LoadedModel(model=None, tokenizer=load_tokenizer(spec.model), name=spec.model)

    @property
    def vllm(self) -> Any:
        """The actor's vLLM engine (None before the first pass)."""
        return self.adapter.engine


def _sampling(sampling: Any) -> dict[str, Any] | None:
    if sampling.greedy:
        return None
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": sampling.seed}
