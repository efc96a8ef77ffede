"""One vLLM engine for a model folder, with LASER as its drafter (see docs/engines.md).

    from laser.vllm import VllmEngine
    eng = VllmEngine("smollm2-135m", speculation="laser", max_draft=8, draft_len="auto", threads=2)
    eng.register_pool("user/collab/3", pool)          # a laser.drafting.DraftSource, e.g. pools.RetrievalPool
    out = eng.generate(prompts, 96, pool_keys=["user/collab/3", ...], verification="relaxed", k=2, p=0.1)
    out[0].text, out[0].token_ids, out[0].finish_reason, out[0].target_forwards, out[0].aal

The engine runs vLLM's engine core and model runner in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so that the proposer sees the pools registered here; in a Ray job that process is the worker actor.
Build it under ``if __name__ == "__main__":`` in scripts. Requests are fed continuously: ``submit`` hands
one to vLLM, ``step`` runs one engine step and returns those that finished (vLLM schedules up to
``max_num_seqs`` together); ``generate`` is both for a list of prompts.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Sequence

from laser.cost import ForwardCost
from laser.drafting import DraftSource
from laser.vllm import pools
from laser.vllm.budget import ChainBudget

log = logging.getLogger(__name__)

SPECULATION = (None, "laser", "ngram", "suffix")
CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION_LENS = (0, 1, 2, 4, 8, 16)


@dataclass
class VllmResult:
    """One request's generation: what the knowledge Parquet needs from an engine."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "eos", "length" or "stop" (a stop string/token)
    prompt_tokens: int
    target_forwards: int  # target forwards that produced this request's tokens (one per step it took part in)
    accepted_tokens: int  # draft tokens accepted
    seconds: float  # wall seconds from the generate call to this request's last token (the call's, if unknown)

    @property
    def aal(self) -> float:
        """Mean accepted length: tokens per target forward."""
        return len(self.token_ids) / max(self.target_forwards, 1)


def vllm_env(threads: int | None = None, kv_cache_gib: float = 2, in_process: bool = True,
             bind: bool = True) -> dict[str, str]:
    """Environment vLLM reads at start-up: bounded KV memory, threads (pinned to cores 0.. when ``bind``;
    several engines on one machine, such as the job's worker actors, leave placement to the OS), engine
    core in process."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, int(round(kv_cache_gib))))}
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = (f"0-{threads - 1}" if threads > 1 else "0") if bind else "nobind"
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def resolve_model(name_or_path: str) -> str:
    """A bundled model name (de-quantised once into the cache), a saved name, or a path, as a folder."""
    from laser.models import _resolve

    return _resolve(name_or_path)


class VllmEngine:
    """A vLLM ``LLM`` with prefix caching, bounded KV memory and optional LASER drafting.

    Args:
        model: a bundled name (``smollm2-135m``), a saved name or a model folder.
        speculation: None (plain decoding), ``"laser"`` (routed pools as vLLM's drafter), ``"ngram"``
            (vLLM's prompt lookup) or ``"suffix"`` (Arctic Inference's suffix decoding, if installed).
        max_draft: the longest draft chain (vLLM's ``num_speculative_tokens``) (default: 8).
        draft_len: ``"auto"`` (each row's length from the measured step cost and its acceptance) or
            a fixed length (default: ``"auto"``; laser only).
        kv_cache_gib: KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE``) (default: 2).
        threads: CPU threads (default: vLLM's own choice).
        bind_threads: pin the threads to cores 0..threads-1 (one engine per machine, as in benchmarks);
            False leaves placement to the OS (several engines per machine) (default: True).
        max_num_seqs: requests in flight (default: 64).
        max_model_len: prompt + output tokens per request (default: 2048).
        dtype: model dtype (default: ``"float32"``).
        seed: vLLM's seed (default: 0).
        enforce_eager: skip torch.compile (faster start, slower steps) (default: False).
        cost: a measured step-cost model (default: measured on first use and cached on disk).
        vllm_kwargs: passed to ``vllm.LLM``.
    """

    def __init__(self, model: str = "smollm2-135m", *, speculation: str | None = "laser", max_draft: int = 8,
                 draft_len: str | int = "auto", kv_cache_gib: float = 2, threads: int | None = None,
                 bind_threads: bool = True,
                 max_num_seqs: int = 64, max_model_len: int = 2048, dtype: str = "float32", seed: int = 0,
                 enforce_eager: bool = False, cost: ForwardCost | None = None, ngram: tuple[int, int] = (2, 4),
                 **vllm_kwargs):
        if speculation not in SPECULATION:
            raise ValueError(f"speculation must be one of {SPECULATION}, got {speculation!r}")
        if draft_len != "auto" and (not isinstance(draft_len, int) or draft_len < 0):
            raise ValueError(f"draft_len must be 'auto' or an integer >= 0, got {draft_len!r}")
        os.environ.update(vllm_env(threads, kv_cache_gib, in_process=True, bind=bind_threads))
        from vllm import LLM

        self.path = resolve_model(model)
        self.speculation, self.max_draft, self.draft_len = speculation, max_draft, draft_len
        self.threads, self.dtype, self.max_num_seqs = threads, dtype, max_num_seqs
        spec = None
        if speculation == "laser":
            spec = {"method": "custom_class", "model": "laser.vllm.proposer.LaserProposer",
                    "num_speculative_tokens": max_draft}
        elif speculation == "ngram":
            spec = {"method": "ngram", "num_speculative_tokens": max_draft,
                    "prompt_lookup_min": ngram[0], "prompt_lookup_max": ngram[1]}
        elif speculation == "suffix":
            spec = {"method": "suffix", "num_speculative_tokens": max_draft}
        t0 = time.perf_counter()
        self.llm = LLM(model=self.path, dtype=dtype, seed=seed, enable_prefix_caching=True,
                       max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                       max_num_batched_tokens=max(2048, max_num_seqs * (max_draft + 1)),
                       speculative_config=spec, enforce_eager=enforce_eager, **vllm_kwargs)
        self.start_seconds = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()
        self.proposer = self._find_proposer() if speculation == "laser" else None
        self._cost = cost
        if self.proposer is not None:
            self.proposer.budget = self._budget()
        self._serial = 0
        self._pending: dict[str, tuple[int, float]] = {}  # tag -> (prompt tokens, submit time)

    # pools ---------------------------------------------------------------------------------------
    @staticmethod
    def register_pool(key: Hashable, source: DraftSource) -> None:
        """Requests whose pool key is ``key`` draft from ``source`` (this process)."""
        pools.register_source(key, source)

    @staticmethod
    def unregister_pool(key: Hashable) -> None:
        pools.unregister_source(key)

    # generation ----------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """A string is chat-templated (as our engine does); token ids are used as they are."""
        if isinstance(prompt, str):
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        return list(prompt)

    def submit(self, prompt: str | Sequence[int], max_new_tokens: int, *, pool_key: Hashable | None = None,
               verification: str = "greedy", k: int = 2, p: float = 0.1, sampling: dict | None = None,
               stop: Sequence[str] | None = None, ignore_eos: bool = False, rules: dict | None = None,
               draft: bool = True, n_max: int = 8, min_prob: float = 0.0) -> str:
        """Hand one request to vLLM (it schedules it with the others in flight); returns its tag.

        ``verification``: ``"greedy"`` (vLLM's own rule, lossless) or ``"relaxed"`` (accept a draft
        token that is the argmax, or in the target's top-``k`` with probability > ``p``; temperature 0).
        ``sampling``: ``temperature``/``top_p``/``top_k``/``seed`` (default: greedy).
        ``rules``: :class:`laser.GenerationRules` keywords vLLM has (``repetition_penalty``,
        ``min_new_tokens``, ``stop_strings``); others are refused. ``draft=False``: the request drafts
        nothing (plain decoding inside a laser engine). ``n_max``, ``min_prob``: retrieval knobs.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if verification not in ("greedy", "relaxed"):
            raise ValueError(f"verification must be 'greedy' or 'relaxed', got {verification!r}")
        s = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, **(sampling or {})}
        if verification == "relaxed" and s["temperature"] > 0:
            raise ValueError("relaxed verification is deterministic: it needs temperature 0")
        rule_kw = _rule_kwargs(rules)
        stops = list(stop or []) + list(rule_kw.pop("stop", []))
        self._serial += 1
        tag = f"r{self._serial}"
        extra: dict = {"tag": tag, "n_max": int(n_max), "min_prob": float(min_prob)}
        if not draft:
            extra["draft"] = False
        if pool_key is not None:
            extra["pool"] = pool_key
        if verification == "relaxed":
            extra.update(k=int(k), p=float(p))
        params = SamplingParams(max_tokens=max_new_tokens, temperature=float(s["temperature"]),
                                top_p=float(s["top_p"]), top_k=int(s["top_k"] or 0),
                                seed=s["seed"] if s["temperature"] > 0 else None, stop=stops or None,
                                ignore_eos=ignore_eos, extra_args={"laser": extra},
                                output_kind=RequestOutputKind.FINAL_ONLY, **rule_kw)
        ids = self.encode(prompt)
        self.llm.llm_engine.add_request(tag, TokensPrompt(prompt_token_ids=ids), params)
        self._pending[tag] = (len(ids), time.perf_counter())
        return tag

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by :meth:`step`."""
        return len(self._pending)

    def step(self) -> list[tuple[str, VllmResult]]:
        """One vLLM engine step; the requests it finished, as (tag, result)."""
        done = []
        for out in self.llm.llm_engine.step():
            if not out.finished or out.request_id not in self._pending:
                continue
            prompt_tokens, t0 = self._pending.pop(out.request_id)
            done.append((out.request_id, self._result(out, prompt_tokens, time.perf_counter() - t0)))
        return done

    def abort_all(self) -> None:
        """Drop every request in flight (after a failed step)."""
        if self._pending:
            self.llm.llm_engine.abort_request(list(self._pending))
            self._pending.clear()

    def generate(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int, *,
                 pool_keys: Sequence[Hashable | None] | None = None,
                 samplings: Sequence[dict | None] | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, **kwargs) -> list[VllmResult]:
        """Every prompt's result, in order (all submitted at once; vLLM keeps ``max_num_seqs`` in flight).

        ``pool_keys`` and ``samplings`` (None entries: the call's ``temperature``/``top_p``/``top_k``/``seed``)
        are per prompt; other keywords are :meth:`submit`'s.
        """
        if pool_keys is not None and len(pool_keys) != len(prompts):
            raise ValueError(f"{len(pool_keys)} pool keys for {len(prompts)} prompts")
        call = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
        tags = [self.submit(pr, max_new_tokens, pool_key=pool_keys[i] if pool_keys is not None else None,
                            sampling={**call, **((samplings[i] if samplings is not None else None) or {})},
                            **kwargs)
                for i, pr in enumerate(prompts)]
        results: dict[str, VllmResult] = {}
        while len(results) < len(tags):
            results.update(self.step())
        return [results[t] for t in tags]

    def _result(self, out, prompt_tokens: int, seconds: float) -> VllmResult:
        c = out.outputs[0]
        tokens = list(c.token_ids)
        stats = self.proposer.take_stats(out.request_id) if self.proposer is not None else None
        steps = stats[0] if stats else None
        forwards = max(1, min(steps, len(tokens))) if steps else max(len(tokens), 1)
        if c.finish_reason == "length":
            reason = "length"
        elif c.stop_reason is None:
            reason = "eos"
        else:
            reason = "stop"
        return VllmResult(text=c.text, token_ids=tokens, finish_reason=reason, prompt_tokens=prompt_tokens,
                          target_forwards=forwards, accepted_tokens=max(len(tokens) - forwards, 0),
                          seconds=_finish_seconds(out, seconds))

    # draft length --------------------------------------------------------------------------------
    def _budget(self) -> ChainBudget:
        if self.draft_len != "auto":
            return ChainBudget(cost=None, max_len=self.max_draft, fixed=int(self.draft_len))
        return ChainBudget(cost=self.cost, max_len=self.max_draft)

    @property
    def cost(self) -> ForwardCost:
        """The measured step-cost model (measured on first use, cached under the laser cache)."""
        if self._cost is None:
            self._cost = self.measure_cost()
        return self._cost

    def cost_key(self) -> str:
        import vllm

        cfg = json.loads((Path(self.path) / "config.json").read_text())
        parts = [cfg.get("architectures"), cfg.get("hidden_size"), cfg.get("num_hidden_layers"),
                 cfg.get("vocab_size"), self.dtype, self.threads, os.cpu_count(), vllm.__version__,
                 self.max_draft, "vllm-step"]
        return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]

    def measure_cost(self, remeasure: bool = False, rows: Sequence[int] = CALIBRATION_ROWS,
                     lens: Sequence[int] = CALIBRATION_LENS, context: int = 256, repeats: int = 5) -> ForwardCost:
        """Seconds of one vLLM step against rows x tokens per row, timed on this engine.

        Each row count runs that many requests whose proposer drafts a fixed number of junk tokens
        (rejected, so every row stays one token per step) cycling through ``lens``; the wall time
        between successive ``propose`` calls of identical batches is one step (scheduler, forward,
        verification, drafting); the median of ``repeats`` is kept. A first, untimed pass meets every
        shape once (the first step of a new shape pays for kernel selection on CPU: 0.1-0.2 s).
        Cached as JSON for the next engine of the same model and threads.
        """
        from laser.cost import cost_cache_dir

        if self.proposer is None:
            raise ValueError("the step-cost model is measured through the laser proposer (speculation='laser')")
        lens = [L for L in lens if L <= self.max_draft]
        rows = [r for r in rows if r <= self.max_num_seqs]
        key = self.cost_key()
        path = cost_cache_dir() / f"{key}.json"
        if path.exists() and not remeasure:
            cost = ForwardCost.load(path)
            if cost.rows == list(rows) and cost.nodes == [L + 1 for L in lens]:
                return cost
        log.info("measuring the vLLM step cost model (%d row counts; cached for the next run)", len(rows))
        self.warm_shapes(rows, lens, context)
        table, measured = [], {}
        for b in rows:
            times = self._calibrate(b, lens, context, repeats)
            row = []
            for L in lens:
                ts = sorted(times.get((b, L), []))
                sec = ts[len(ts) // 2] if ts else float("nan")
                measured[f"{b}x{L + 1}"] = sec
                row.append(sec)
            table.append(row)
        table = _fill_nan(table)
        cost = ForwardCost(key=key, rows=list(rows), nodes=[L + 1 for L in lens], seconds=table,
                           context=context, measured=measured)
        cost.save(path)
        return cost

    def warm_shapes(self, rows: Sequence[int], lens: Sequence[int] = CALIBRATION_LENS, context: int = 64) -> None:
        """Run every (rows x draft length) step shape once, untimed: the first step of a new shape pays for
        kernel selection, which a measurement (or a benchmark) should not count."""
        if self.proposer is None:
            raise ValueError("warm_shapes drafts through the laser proposer (speculation='laser')")
        for b in rows:
            self._calibrate(b, [L for L in lens if L <= self.max_draft], context, 1)

    def _calibrate(self, b: int, lens: Sequence[int], context: int, repeats: int) -> dict:
        """``b`` requests drafting junk of each length in ``lens`` in turn; step times by (rows, length)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from laser.vllm.proposer import StepLog

        saved = self.proposer.budget
        self.proposer.budget = ChainBudget(cost=None, max_len=self.max_draft, fixed=self.max_draft)
        self.proposer.step_log = StepLog()
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self._serial += 1
        try:
            steps = 2 + repeats * len(lens)
            prompts, params = [], []
            for i in range(b):
                ids = [(17 + 31 * (i * context + j) + 7 * self._serial) % (vocab - 10) + 5 for j in range(context)]
                prompts.append(TokensPrompt(prompt_token_ids=ids))
                params.append(SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True,
                                             extra_args={"laser": {"force_cycle": list(lens),
                                                                   "tag": f"cal{self._serial}.{b}.{i}"}}))
            self.llm.generate(prompts, params, use_tqdm=False)
            return dict(self.proposer.step_log.times)
        finally:
            self.proposer.step_log = None
            self.proposer.budget = saved
            self.proposer.finish_all()

    def close(self) -> None:
        """Free the engine (its KV cache and model)."""
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
        self.proposer = None
        gc.collect()

    def _find_proposer(self):
        from laser.vllm.proposer import LIVE

        cfg = self.llm.llm_engine.vllm_config
        prop = LIVE.get(id(cfg))
        if prop is None and LIVE:
            prop = list(LIVE.values())[-1]
        if prop is None:
            raise RuntimeError("vLLM did not build the laser proposer in this process")
        return prop


def _rule_kwargs(rules: dict | None) -> dict:
    """:class:`laser.GenerationRules` keywords as vLLM ``SamplingParams`` keywords (``stop`` separately)."""
    rules = dict(rules or {})
    out: dict = {}
    penalty = rules.pop("repetition_penalty", 1.0)
    if penalty != 1.0:
        out["repetition_penalty"] = float(penalty)
    if rules.get("min_new_tokens"):
        out["min_tokens"] = int(rules.pop("min_new_tokens"))
    rules.pop("min_new_tokens", None)
    if rules.get("stop_strings"):
        out["stop"] = list(rules.pop("stop_strings"))
    rules.pop("stop_strings", None)
    unsupported = sorted(k for k, v in rules.items() if v)
    if unsupported:
        raise ValueError(f"generation rule(s) {unsupported} have no vLLM form; use execution.engine: hf")
    return out


def _finish_seconds(out, wall: float) -> float:
    m = getattr(out, "metrics", None)
    for a, b in (("first_scheduled_time", "last_token_time"), ("arrival_time", "last_token_time")):
        t0, t1 = getattr(m, a, None), getattr(m, b, None)
        if t0 and t1 and t1 >= t0:
            return float(t1 - t0)
    return wall


def _fill_nan(table: list[list[float]]) -> list[list[float]]:
    """Fill shapes with no timing from the nearest timed one of the same row count, scaled by tokens."""
    import math

    out = []
    for row in table:
        good = [(j, t) for j, t in enumerate(row) if not math.isnan(t)]
        if not good:
            raise RuntimeError("the step-cost measurement timed no step; is the machine overloaded?")
        out.append([t if not math.isnan(t) else min(good, key=lambda g: abs(g[0] - j))[1] for j, t in enumerate(row)])
    return out
