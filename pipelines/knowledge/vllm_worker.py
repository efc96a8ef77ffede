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
measured on this engine (cached per machine). Requests are handed to vLLM ``slots`` at a time; vLLM
schedules them continuously. Degenerate-text retries run on the transformers model the actor also
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
                                   max_num_seqs=max(slots, 1), dtype=dtype, seed=self.spec.seed)
        want = "auto" if getattr(decoder, "adaptive", False) else min(int(getattr(decoder, "K", 0)), MAX_DRAFT)
        if want != self._draft_len:
            self.vllm.draft_len = want
            self.vllm.proposer.budget = self.vllm._budget()
            self._draft_len = want
        return self.vllm

    def serve(self, task: DecodeTask, take: Callable[[int], list[GenerationRequest]], slots: int) -> Iterator[BatchResult]:
        """Pull up to ``slots`` requests, generate them together on vLLM, yield each one's row; repeat."""
        from laser.vllm import pools as vpools

        decoder, params_json = self._decoder(task)
        engine = self._engine(decoder, slots)
        relaxed = getattr(decoder, "verification", "greedy") == "relaxed"
        drafts = getattr(decoder, "K", 0) != 0 and decoder.pool != "none"
        while True:
            got = take(slots)
            if not got:
                return
            failed: list[dict[str, str]] = []
            batch: list[tuple[GenerationRequest, str, Any, list[int], Any]] = []
            for req in got:
                try:
                    prompt, pool = self.prompt(task, req), self._pool(task, req.pool_key)
                    sampling = entity_sampling(task.sampling, req.entity_type, req.entity_id)
                    if pool is not None:
                        vpools.register_source(req.pool_key, pool)
                    batch.append((req, prompt, pool, decoder.encode(prompt), sampling))
                except Exception as exc:  # one bad entity never takes down the others
                    failed.append(_failure(req, exc))
            t0 = time.perf_counter()
            try:
                results = engine.generate(
                    [b[3] for b in batch], task.max_new_tokens,
                    pool_keys=[b[0].pool_key if b[2] is not None else None for b in batch],
                    verification="relaxed" if relaxed else "greedy", k=getattr(decoder, "k", 2),
                    p=getattr(decoder, "p", 0.1), draft=drafts, n_max=getattr(decoder, "n_max", 8),
                    min_prob=getattr(decoder, "min_prob", 0.0), rules=task.rules,
                    samplings=[_vllm_sampling(b[4]) for b in batch]) if batch else []
            except Exception as exc:  # the whole batch failed: each request fails with the reason
                results = None
                failed += [_failure(b[0], exc) for b in batch]
            wall = time.perf_counter() - t0
            self._forget_pools(vpools)
            first = True
            for b, res in zip(batch, results or []):
                req, prompt, pool = b[0], b[1], b[2]
                part = self._finish(task, req, prompt, pool, VllmResultView(res), params_json)
                if first:
                    part.decode_s += wall
                    part.failures[:0], failed = failed, []
                    first = False
                yield part
            if failed:
                yield BatchResult(failures=failed)

    def _forget_pools(self, vpools: Any) -> None:
        """Registered pools that left the LRU are unregistered (the registry never outgrows the LRU)."""
        for key in [k for k in list(vpools._SOURCES) if k not in self._pools]:
            vpools.unregister_source(key)


def _vllm_sampling(sampling: Any) -> dict[str, Any] | None:
    if sampling.greedy:
        return None
    return {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": sampling.seed}
