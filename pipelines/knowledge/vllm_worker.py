"""Knowledge generation on vLLM (``execution.engine: vllm``): the same worker actor, a vLLM engine inside.

:class:`VllmGenerationWorker` is a :class:`~pipelines.knowledge.generation.GenerationWorker` whose
``serve`` feeds :class:`laser.vllm.VllmEngine` instead of the tree-attention engine. Everything else is
the parent's: prompts, pools (LRU over the pool store), rows (same fields: AAL, forwards, finish reason,
quality flags, timings), the degenerate-text policy. Each request's pool is registered under its pool
key and the key travels with the request into vLLM, where LASER's proposer drafts from it.

One vLLM engine per actor, with LASER's proposer: decoders without drafting (``autoregressive``) run
their requests with drafting off; ``laser`` and ``resd`` draft from the request's pool (routed or
global, as routing chose), ``laser`` with its verification rule. The draft length is the decoder's
``K`` (capped at ``MAX_DRAFT``) or, for ``K: auto``, follows the load through the step-cost model
measured on this engine (cached per machine). Requests are fed continuously: ``slots`` stay in vLLM,
and each one that finishes is written and replaced at once. Degenerate-text retries run on the transformers model the actor also
holds (the parent's path).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

from laser.request import DecodeStats
from pipelines.knowledge.generation import BatchResult, DecodeTask, GenerationWorker, _failure
from pipelines.knowledge.sampling import entity_sampling
from pipelines.workers import GenerationRequest, ModelSpec

log = logging.getLogger(__name__)

MAX_DRAFT = 8  # vLLM's num_speculative_tokens for the actor's engine


class VllmResultView:
    """A :class:`laser.vllm.VllmResult` shaped like a decoder's generation (``text``, ``token_ids``,
    ``stats``) for the parent's row builder."""

    def __init__(self, res: Any):
        self.text, self.token_ids = res.text, res.token_ids
        forwards = int(res.target_forwards)
        self.stats = DecodeStats(target_forwards=forwards, new_tokens=len(res.token_ids),
                                 accepted_per_step=[int(res.accepted_tokens)] + [0] * max(forwards - 1, 0),
                                 finish_reason=res.finish_reason, decode_s=float(res.seconds))


class VllmGenerationWorker(GenerationWorker):
    """A knowledge worker actor whose decoding runs on vLLM (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.spec = spec
        self.vllm: Any = None
        self._draft_len: Any = None

    def _engine(self, decoder: Any, slots: int) -> Any:
        from laser.vllm import VllmEngine

        if self.vllm is None:
            dtype = self.spec.dtype if self.spec.dtype != "auto" or self.spec.device == "cuda" else "float32"
            self.vllm = VllmEngine(self.spec.model, speculation="laser", max_draft=MAX_DRAFT, draft_len=MAX_DRAFT,
                                   threads=self.spec.threads if self.spec.device == "cpu" else None,
                                   bind_threads=False,  # the node's other actors share its cores
                                   max_num_seqs=max(slots, 1), dtype=dtype, seed=self.spec.seed)
        want = "auto" if getattr(decoder, "adaptive", False) else min(int(getattr(decoder, "K", 0)), MAX_DRAFT)
        if want != self._draft_len:
            self.vllm.draft_len = want
            self.vllm.proposer.budget = self.vllm._budget()
            self._draft_len = want
        return self.vllm

    def serve(self, task: DecodeTask, take: Callable[[int], list[GenerationRequest]], slots: int) -> Iterator[BatchResult]:
        """Keep up to ``slots`` requests in vLLM, topping up with ``take`` as requests finish; yield each
        finished request's row (vLLM schedules the requests in flight together, step by step)."""
        from laser.vllm import pools as vpools

        decoder, params_json = self._decoder(task)
        engine = self._engine(decoder, slots)
        relaxed = getattr(decoder, "verification", "greedy") == "relaxed"
        opts = dict(verification="relaxed" if relaxed else "greedy", k=getattr(decoder, "k", 2),
                    p=getattr(decoder, "p", 0.1), draft=getattr(decoder, "K", 0) != 0 and decoder.pool != "none",
                    n_max=getattr(decoder, "n_max", 8), min_prob=getattr(decoder, "min_prob", 0.0), rules=task.rules)
        live: dict[str, tuple[GenerationRequest, str, Any]] = {}  # tag -> (request, prompt, pool)
        stepped = 0.0  # engine seconds not yet counted in a result (steps are shared: counted once)
        while True:
            failed: list[dict[str, str]] = []
            for req in take(slots - len(live)):
                try:  # one bad entity never takes down the others
                    prompt, pool = self.prompt(task, req), self._pool(task, req.pool_key)
                    if pool is not None:
                        vpools.register_source(req.pool_key, pool)
                    sampling = _vllm_sampling(entity_sampling(task.sampling, req.entity_type, req.entity_id))
                    tag = engine.submit(decoder.encode(prompt), task.max_new_tokens, sampling=sampling,
                                        pool_key=req.pool_key if pool is not None else None, **opts)
                    live[tag] = (req, prompt, pool)
                except Exception as exc:
                    failed.append(_failure(req, exc))
            if failed:
                yield BatchResult(failures=failed)
            if not live:
                return
            t0 = time.perf_counter()
            try:
                finished = engine.step()
            except Exception as exc:  # the engine failed: every request in it fails with the reason
                finished = []
                yield BatchResult(failures=[_failure(req, exc) for req, _, _ in live.values()])
                live.clear()
                engine.abort_all()
            stepped += time.perf_counter() - t0
            for tag, res in finished:
                req, prompt, pool = live.pop(tag)
                part = self._finish(task, req, prompt, pool, VllmResultView(res), params_json)
                part.decode_s, stepped = part.decode_s + stepped, 0.0
                yield part
            if finished:
                self._forget_pools(vpools, {req.pool_key for req, _, _ in live.values()})

    def _forget_pools(self, vpools: Any, in_use: set) -> None:
        """Registered pools that left the LRU and no request in flight uses are unregistered (the registry
        stays about the LRU's size)."""
        for key in [k for k in vpools.registered_keys() if k not in self._pools and k not in in_use]:
            vpools.unregister_source(key)


def _vllm_sampling(sampling: Any) -> dict[str, Any] | None:
    if sampling.greedy:
        return None
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": sampling.seed}
