"""One vLLM method at one concurrency, in a process of its own (a fresh engine: no prefix cache or suffix
tree left by another level; vLLM's memory freed when the process ends). Run by
:mod:`pipelines.tools.bench.throughput_vllm` in a spawned process (:func:`in_fresh_process`).

The spec holds the model, threads, method (speculation, verification, draft length), concurrency, the
prompts with their pool keys, the pools by key and (for LASER ``auto``) the step-cost model. The result holds
tokens, wall seconds, a prefill estimate (the same prompts for one token each, prefix cache reset),
outputs, AAL and the engine's start seconds. ``--measure-cost`` instead measures the vLLM step-cost
model (rows up to the highest concurrency).
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any


def _engine(spec: dict[str, Any], max_num_seqs: int):
    from laser.vllm import VllmEngine

    m = spec["method"]
    return VllmEngine(spec["model"], speculation=m["speculation"], max_draft=m.get("max_draft", 8),
                      draft_len=m.get("draft_len", 8), threads=spec["threads"], max_num_seqs=max_num_seqs,
                      max_model_len=spec["max_model_len"], dtype="float32", cost=spec.get("cost"),
                      kv_cache_gib=spec.get("kv_cache_gib", 2))


def _warm(eng, c: int, method: dict[str, Any], vocab: int, prompt_lens: Any = (), max_len: int = 1024) -> None:
    """Meet every step width the timed run can have, untimed, the same way for every method.

    On CPU the first forward of a new token count pays 0.1-0.2 s once (kernel selection), so a fresh
    engine's first minute would count start-up, not steady state; a long-running engine pays it once.
    A step of c rows with up to D draft tokens each has 1..c*(1+D) tokens: one prefill of each length
    (token salad, shared with no measured prompt, so the prefix cache stays cold for them), up to the
    longest prompt the engine takes (``max_len - 1``).
    """
    top = min(c * (1 + int(method.get("max_draft", 8) if method.get("speculation") else 0)), max_len - 1)
    for n in sorted(set(range(1, top + 1)) | set(prompt_lens)):  # and each measured prompt's prefill width
        eng.generate([[(n * 7919 + j * 104729) % (vocab - 10) + 5 for j in range(n)]], 1)
    if eng.proposer is not None:
        eng.warm_shapes([r for r in (1, 2, 4, 8, 16, 32, 64) if r <= c])


def run_level(spec: dict[str, Any]) -> dict[str, Any]:
    m, c = spec["method"], spec["concurrency"]
    t0 = time.perf_counter()
    eng = _engine(spec, c)
    start_s = time.perf_counter() - t0
    for key, pool in (spec.get("pools") or {}).items():
        eng.register_pool(key, pool)
    gen = dict(verification=m.get("verification", "greedy"), k=m.get("k", 2), p=m.get("p", 0.1))
    warm_s = time.perf_counter()
    _warm(eng, c, m, spec.get("vocab", 32000), [len(p) for p in spec["prompts"]], spec["max_model_len"])
    warm_s = time.perf_counter() - warm_s
    prompts, keys = spec["prompts"], spec["pool_keys"]
    t0 = time.perf_counter()
    outs = eng.generate(prompts, spec["max_new_tokens"], pool_keys=keys, **gen)
    wall = time.perf_counter() - t0
    eng.llm.reset_prefix_cache()
    t0 = time.perf_counter()
    eng.generate(prompts, 1, **gen)
    prefill = time.perf_counter() - t0
    chosen = list(eng.proposer.budget.chosen) if eng.proposer is not None else []
    forwards = sum(o.target_forwards for o in outs)
    tokens = sum(len(o.token_ids) for o in outs)
    eng.close()
    return {"tokens": tokens, "wall_s": wall, "prefill_s": prefill, "outputs": [o.token_ids for o in outs],
            "target_forwards": forwards,
            # forwards are counted by LASER's proposer; vLLM's own drafters (ngram, suffix) do not report them
            "aal": tokens / max(forwards, 1) if m["speculation"] in (None, "laser") else None, "start_s": start_s, "warm_s": warm_s,
            "mean_draft_tokens_per_step": (sum(chosen) / len(chosen)) if chosen else None}


def measure_cost(spec: dict[str, Any]) -> dict[str, Any]:
    rows = tuple(r for r in (1, 2, 4, 8, 16, 32, 64) if r <= max(spec["concurrency"], 2))
    eng = _engine({**spec, "method": {"speculation": "laser", "draft_len": 8}}, max(rows))
    _warm(eng, max(rows), {"speculation": "laser", "max_draft": 8}, spec.get("vocab", 32000), (),
          spec["max_model_len"])
    cost = eng.measure_cost(remeasure=True, rows=rows, lens=(0, 1, 2, 4, 8))
    eng.close()
    return asdict(cost)


def in_fresh_process(fn, spec: dict[str, Any]) -> dict[str, Any]:
    """``fn(spec)`` in a newly spawned interpreter that ends afterwards."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, spec).result()
