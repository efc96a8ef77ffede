"""One vLLM engine for a model folder, with LASER as its drafter (see docs/engines.md).

    from laser.vllm import VllmEngine
    eng = VllmEngine("smollm2-135m", speculation="laser", max_draft=8, draft_len="auto", threads=2)
    eng.register_pool("user/collab/3", pool)          # a laser.drafting.DraftSource, e.g. pools.RetrievalPool
    out = eng.generate(prompts, 96, pool_keys=["user/collab/3", ...], verification="relaxed", k=2, p=0.1)
    out[0].text, out[0].token_ids, out[0].finish_reason, out[0].target_forwards, out[0].aal

The engine runs vLLM's engine core and model runner in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so that the proposer sees the pools registered here; in a Ray job that process is the worker actor. With
``in_process=False`` or ``tensor_parallel_size`` > 1 the proposer lives in vLLM's own processes: requests
then name their pool store, each carries its draft length, the step-cost table reaches the proposer
through the environment (:data:`laser.vllm.proposer.COST_ENV`) and per-request statistics come from
vLLM's speculative-decoding metrics.

This module is the request loop; what a request gave is :mod:`laser.vllm.results`, the process
environment and vLLM's configuration :mod:`laser.vllm.env`, the step-cost calibration
:mod:`laser.vllm.calibrate`, a request's LASER arguments :class:`laser.vllm.request_args.LaserArgs`, and the
draft-length budget belongs to the proposer.
Build it under ``if __name__ == "__main__":`` in scripts. Requests are fed continuously: ``submit`` hands
one to vLLM, ``step`` runs one engine step and returns those that finished (vLLM schedules up to
``max_num_seqs`` together); ``generate`` is both for a list of prompts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from laser.cost import ForwardCost
from laser.defaults import N_MAX, RELAXED_K, RELAXED_P
from laser.drafting import DraftSource
from laser.models import chat_ids, model_dir
from laser.request import Halt
from laser.vllm import calibrate, env, sources
from laser.vllm.calibrate import CALIBRATION_LENS, CALIBRATION_ROWS
from laser.vllm.env import default_block_size
from laser.vllm.forms import rule_params
from laser.vllm.request_args import DraftLen, LaserArgs
from laser.vllm.results import VllmResult, request_result
from laser.vllm.requirements import installed_has

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm import LLM, RequestOutput, SamplingParams

    from laser.vllm.proposer import LaserProposer

log = logging.getLogger(__name__)


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
        max_model_len: prompt + output tokens per request; None: the model's own context length, cut by
            vLLM to what the KV cache holds (vLLM's ``-1``) (default: 2048).
        dtype: model dtype (default: ``"float32"``).
        seed: vLLM's seed (default: 0).
        enforce_eager: skip torch.compile (faster start, slower steps) (default: False).
        block_size: tokens per KV block, the unit the prefix cache shares (default: :data:`CPU_BLOCK` on
            CPU, vLLM's own on GPU).
        cost: a step-cost table to start the ``auto`` draft length from (default: the one measured on this
            machine by :meth:`measure_cost` if cached, else the shipped prior; corrected online either way).
        on_start: called with a line of progress at each start-up stage (loading and compiling, ready in
            N s); the same lines go to this module's logger at INFO.
        pool_roots: directories the pool stores this engine's requests name lie in, added to
            ``LASER_POOL_ROOTS`` for vLLM's engine core (a store outside every root never opens,
            :mod:`laser.vllm.sources`); with the engine core in this process, :meth:`submit` lets in the
            store it is given, so only an engine core elsewhere needs them.
        vllm_kwargs: passed to ``vllm.LLM``.

    vLLM keeps per-request statistics (``disable_log_stats=False``: the queue, first-token and last-token
    timestamps behind :class:`VllmResult`'s ``prefill_s``/``decode_s``) but its stat loggers (periodic log
    lines, Prometheus) are dropped; pass ``disable_log_stats=True`` to turn both off.
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        speculation: str | None = "laser",
        max_draft: int = 8,
        draft_len: DraftLen = "auto",
        kv_cache_gib: float = 2,
        threads: int | None = None,
        bind_threads: bool = True,
        in_process: bool = True,
        max_num_seqs: int = 64,
        max_model_len: int | None = 2048,
        dtype: str = "float32",
        seed: int = 0,
        enforce_eager: bool = False,
        block_size: int | None = None,
        cost: ForwardCost | None = None,
        ngram: tuple[int, int] = (2, 4),
        on_start: Callable[[str], None] | None = None,
        pool_roots: Sequence[str | os.PathLike[str]] = (),
        **vllm_kwargs: Any,
    ) -> None:
        spec = env.speculation_config(speculation, max_draft, ngram)
        _check_draft_len(draft_len)
        env.set_engine_env(threads, kv_cache_gib, in_process=in_process, bind=bind_threads)
        from laser.vllm.proposer import COST_ENV

        self.path = model_dir(model)  # a bundled name de-quantised once, a saved name, or a path
        self.speculation, self.max_draft, self.draft_len = speculation, max_draft, draft_len
        self.threads, self.dtype, self.max_num_seqs = threads, dtype, max_num_seqs
        self._cost = cost
        self.pool_roots = sources.add_pool_roots(pool_roots)  # before vLLM starts: its engine core reads them
        if speculation == "laser":
            os.environ[COST_ENV] = self.cost.to_json()  # the proposer's budget, in whichever process
            if not in_process or int(vllm_kwargs.get("tensor_parallel_size", 1)) > 1:
                _ask_spec_metrics(vllm_kwargs)  # stats from elsewhere
        block_size = block_size or default_block_size()
        if block_size is not None:
            vllm_kwargs["block_size"] = block_size
        self.llm: LLM | None = self._start(
            on_start,
            enforce_eager,
            seed=seed,
            enable_prefix_caching=True,
            max_num_seqs=max_num_seqs,
            max_model_len=-1 if max_model_len is None else max_model_len,  # -1: vLLM fits it to the KV cache
            max_num_batched_tokens=max(2048, max_num_seqs * (max_draft + 1)),
            speculative_config=spec,
            enforce_eager=enforce_eager,
            **vllm_kwargs,
        )
        # vLLM hands back the Hugging Face tokenizer it loaded (typed as its own protocol)
        self.tokenizer = cast("PreTrainedTokenizerBase", self._vllm.get_tokenizer())
        self.proposer: LaserProposer | None = self._find_proposer() if speculation == "laser" else None
        self._watch_engine_core()
        self._serial = 0
        self._pending: dict[str, tuple[int, float]] = {}  # tag -> (prompt tokens, submit time)
        self._halts: dict[str, Halt] = {}  # tag -> the caller's stop check

    def _start(self, on_start: Callable[[str], None] | None, eager: bool, **llm_kwargs: Any) -> LLM:
        """vLLM's ``LLM`` for this engine's model, with start-up progress (:func:`_say`) and where the
        compiled model is cached (``compile_cache_dir``, ``compile_cache_reused``)."""
        from vllm import LLM

        t0, wall_t0, inductor_t0 = time.perf_counter(), time.time(), env.inductor_cache_counts()
        _say(
            on_start,
            f"vLLM engine: loading {Path(self.path).name} ({self.dtype}, threads={self.threads or 'auto'}, "
            f"speculation={self.speculation})"
            + (
                ""
                if eager
                else "; torch.compile (minutes the first time on a machine; later starts reuse the compile cache)"
            ),
        )
        keep_stat_loggers = "disable_log_stats" in llm_kwargs
        llm_kwargs.setdefault("disable_log_stats", False)  # per-request timestamps (RequestOutput.metrics)
        llm = LLM(model=self.path, dtype=self.dtype, **llm_kwargs)  # type: ignore[arg-type]  # vLLM checks dtype
        if not keep_stat_loggers:
            llm.llm_engine.logger_manager = None  # request stats stay; no periodic stat lines
        self.start_seconds = time.perf_counter() - t0
        self.compile_cache_dir, self.compile_cache_reused = env.compile_cache(llm, wall_t0, inductor_t0)
        _say(
            on_start,
            f"vLLM engine: ready in {self.start_seconds:.1f} s"
            + (
                ""
                if self.compile_cache_dir is None
                else f" ({'compiled model loaded from' if self.compile_cache_reused else 'model compiled into'} "
                f"{self.compile_cache_dir})"
            ),
        )
        return llm

    @property
    def _vllm(self) -> LLM:
        """vLLM's ``LLM`` (closed: refused in one line)."""
        if self.llm is None:
            raise RuntimeError("this vLLM engine is closed; build a new one")
        return self.llm

    # pools ---------------------------------------------------------------------------------------
    def register_pool(self, key: Hashable, source: DraftSource) -> None:
        """Requests whose pool key is ``key`` (and no ``pool_store``) draft from ``source``, registered in this
        process: it needs vLLM's engine core here (``in_process=True``). With the engine core in another
        process, requests name their pool store instead (``submit(..., pool_key=, pool_store=)``)."""
        if self.speculation == "laser" and self.proposer is None:
            raise RuntimeError(
                "register_pool: vLLM's engine core runs in another process (in_process=False) "
                "and cannot see pools registered here; pass pool_store= to submit/generate"
            )
        sources.register_source(key, source)

    def unregister_pool(self, key: Hashable) -> None:
        sources.unregister_source(key)

    def _let_in(self, pool_store: str | os.PathLike[str], pool_key: Hashable | None) -> None:
        """The owner's own requests may name any store: trusted in this process's proposer; with the engine
        core elsewhere, the store must lie in the roots it started with."""
        if pool_key is None:
            raise ValueError("pool_store needs a pool_key (the pool's key in the store)")
        if self.proposer is not None:
            self.proposer.store_pools.trust(pool_store)
        elif self.speculation == "laser" and not sources.within(pool_store, self.pool_roots):
            raise ValueError(
                f"pool store {os.fspath(pool_store)} is outside the pool roots vLLM's engine core started with "
                f"({sources.ROOTS_ENV}); pass pool_roots= when building the engine"
            )

    # generation ----------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """A string is chat-templated (as our engine does); token ids are used as they are."""
        if isinstance(prompt, str):
            return chat_ids(self.tokenizer, prompt)
        return list(prompt)

    def submit(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int,
        *,
        pool_key: Hashable | None = None,
        verification: str = "greedy",
        k: int = RELAXED_K,
        p: float = RELAXED_P,
        sampling: dict[str, Any] | None = None,
        stop: Sequence[str] | None = None,
        ignore_eos: bool = False,
        rules: dict[str, Any] | None = None,
        draft: bool = True,
        n_max: int = N_MAX,
        min_prob: float = 0.0,
        pool_store: str | os.PathLike[str] | None = None,
        halt: Halt | None = None,
        earlier: Sequence[int] | None = None,
    ) -> str:
        """Hand one request to vLLM (it schedules it with the others in flight); returns its tag.

        ``verification``: ``"greedy"`` (vLLM's own rule, lossless) or ``"relaxed"`` (a draft token that is the
        argmax, or in the target's top-``k`` with probability > ``p``; temperature 0). ``sampling``:
        ``temperature``/``top_p``/``top_k``/``seed`` (default greedy). ``rules``: :class:`laser.GenerationRules`
        keywords vLLM has. ``draft=False``: plain decoding. ``halt``: a stop check on the new tokens after each
        step (:data:`laser.request.Halt`); when it says stop, the request is aborted and :meth:`step` returns
        its first ``keep`` tokens. ``earlier``: the entity's earlier text (token ids), drafted first. A
        malformed LASER argument is refused here (:class:`~laser.vllm.request_args.LaserArgsError`).
        """
        from vllm.inputs import TokensPrompt

        s = _checked_sampling(verification, sampling)
        rule_kw = rule_params(rules, self.tokenizer)
        stops = list(stop or []) + list(rule_kw.pop("stop", []))
        if pool_store is not None:
            self._let_in(pool_store, pool_key)
        self._serial += 1
        tag = f"r{self._serial}"
        relaxed = verification == "relaxed"
        args = LaserArgs(
            tag=tag,
            pool=pool_key,
            draft=draft,
            draft_len=self.draft_len,
            pool_store=os.fspath(pool_store) if pool_store is not None else None,  # any process layout
            k=int(k) if relaxed else None,
            p=float(p) if relaxed else None,
            earlier=tuple(int(t) for t in earlier) if earlier and draft else None,
            n_max=int(n_max),
            min_prob=float(min_prob),
        )
        params = _vllm_params(max_new_tokens, s, stops, ignore_eos, args, cumulative=halt is not None, **rule_kw)
        ids = self.encode(prompt)
        self._vllm.llm_engine.add_request(tag, TokensPrompt(prompt_token_ids=ids), params)
        self._pending[tag] = (len(ids), time.perf_counter())
        if halt is not None:
            self._halts[tag] = halt
        return tag

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by :meth:`step`."""
        return len(self._pending)

    @property
    def decode_clock(self) -> tuple[float, int] | None:
        """(seconds, tokens) of the steps so far in which no request prefilled, as LASER's proposer timed
        them; None where it cannot see the steps (other speculation, or the engine core in another process)."""
        if self.proposer is None:
            return None
        return self.proposer.decode_clock.seconds, self.proposer.decode_clock.tokens

    def step(self) -> list[tuple[str, VllmResult]]:
        """One vLLM engine step; the requests it finished, as (tag, result)."""
        from vllm import RequestOutput

        done = []
        engine = self._vllm.llm_engine
        for out in engine.step():
            tag, stop = out.request_id, None
            if tag not in self._pending or not isinstance(out, RequestOutput):  # (pooling outputs: not ours)
                continue
            if not out.finished:  # a partial output: only requests with a stop check stream them
                halt = self._halts.get(tag)
                stop = halt(out.outputs[0].token_ids) if halt is not None else None
                if stop is None:
                    continue
                engine.abort_request([tag])
            prompt_tokens, t0 = self._pending.pop(tag)
            self._halts.pop(tag, None)
            done.append((tag, self._result(out, prompt_tokens, time.perf_counter() - t0, stop)))
        return done

    @property
    def dead(self) -> bool:
        """Whether this engine can run nothing more: closed, or its engine-core process is gone (then every
        call fails; build a new engine). An engine core in this process lives and dies with it."""
        if self.llm is None:
            return True
        res = getattr(self.llm.llm_engine.engine_core, "resources", None)
        procs = getattr(getattr(res, "engine_manager", None), "processes", None) or []
        return bool(getattr(res, "engine_dead", False)) or any(not p.is_alive() for p in procs)

    def _watch_engine_core(self) -> None:
        """With the engine core in another process, vLLM 0.32's client waits for its outputs with no timeout,
        so a step in flight when that process dies (killed, out of memory) would wait forever: a daemon
        thread wakes it with vLLM's ``EngineDeadError`` once an engine-core process exits."""
        core = self._vllm.llm_engine.engine_core
        outputs = getattr(core, "outputs_queue", None)
        procs = getattr(getattr(getattr(core, "resources", None), "engine_manager", None), "processes", None)
        if outputs is None or not procs:
            return

        def watch() -> None:
            from multiprocessing.connection import wait

            from vllm.v1.engine.exceptions import EngineDeadError

            wait([p.sentinel for p in procs])
            outputs.put_nowait(EngineDeadError())

        threading.Thread(target=watch, daemon=True, name="laser-engine-core-watch").start()

    def abort_all(self) -> None:
        """Drop every request in flight (after a failed step)."""
        pending, self._pending = list(self._pending), {}
        self._halts.clear()
        if pending:
            self._vllm.llm_engine.abort_request(pending)

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int,
        *,
        pool_keys: Sequence[Hashable | None] | None = None,
        samplings: Sequence[dict[str, Any] | None] | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> list[VllmResult]:
        """Every prompt's result, in order (all submitted at once; vLLM keeps ``max_num_seqs`` in flight).

        ``pool_keys`` and ``samplings`` (None entries: the call's ``temperature``/``top_p``/``top_k``/``seed``)
        are per prompt; other keywords are :meth:`submit`'s.
        """
        if pool_keys is not None and len(pool_keys) != len(prompts):
            raise ValueError(f"{len(pool_keys)} pool keys for {len(prompts)} prompts")
        call = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
        tags = [
            self.submit(
                pr,
                max_new_tokens,
                pool_key=pool_keys[i] if pool_keys is not None else None,
                sampling={**call, **((samplings[i] if samplings is not None else None) or {})},
                **kwargs,
            )
            for i, pr in enumerate(prompts)
        ]
        results: dict[str, VllmResult] = {}
        while len(results) < len(tags):
            results.update(self.step())
        return [results[t] for t in tags]

    def _result(
        self, out: RequestOutput, prompt_tokens: int, seconds: float, halted: tuple[str, int] | None = None
    ) -> VllmResult:
        c = out.outputs[0]
        tokens, text = list(c.token_ids), c.text
        if halted:  # the request's halt cut the text short
            tokens = tokens[: halted[1]]
            text = str(self.tokenizer.decode(tokens, skip_special_tokens=True))
        if self.proposer is not None:
            stats = self.proposer.take_stats(out.request_id)
        else:  # engine core in another process: vLLM's per-request metrics, if it was asked to keep them
            from laser.vllm.proposer import RowStats

            stats = RowStats.from_spec_metrics(getattr(c, "spec_decode_metrics", None), len(tokens))
        reason = halted[0] if halted else None
        return request_result(out, tokens, text, stats, self.speculation is not None, prompt_tokens, seconds, reason)

    # draft length --------------------------------------------------------------------------------
    def set_draft_len(self, draft_len: DraftLen) -> None:
        """Requests submitted from now on draft ``"auto"`` (lengths follow the load) or a fixed chain length
        (each request carries it, so it holds wherever vLLM runs the proposer)."""
        _check_draft_len(draft_len)
        self.draft_len = draft_len

    # step cost (laser.vllm.calibrate) ------------------------------------------------------------
    @property
    def cost(self) -> ForwardCost:
        """The step-cost table the proposer's chain budget starts from (:func:`laser.vllm.calibrate.start_cost`:
        the one measured on this machine by :meth:`measure_cost` when cached, else the shipped prior scaled
        to this model and thread count); the budget corrects it from the steps the engine runs."""
        if self._cost is None:
            self._cost = calibrate.start_cost(self.path, self.threads, self.cost_key())
        return self._cost

    def cached_cost(self) -> ForwardCost | None:
        """The step-cost table measured earlier for this engine's key, or None."""
        return calibrate.cached_cost(self.cost_key())

    def cost_key(self) -> str:
        """What a measured step-cost table depends on (:func:`laser.vllm.calibrate.step_cost_key`)."""
        return calibrate.step_cost_key(self.path, self.dtype, self.threads, self.max_draft)

    @staticmethod
    def device_name() -> str:
        """``cpu`` or the name of the CUDA device vLLM runs on."""
        return env.device_name()

    def measure_cost(
        self,
        remeasure: bool = False,
        rows: Sequence[int] = CALIBRATION_ROWS,
        lens: Sequence[int] = CALIBRATION_LENS,
        context: int = 256,
        repeats: int = 5,
    ) -> ForwardCost:
        """Seconds of one vLLM step against rows x tokens per row, timed on this engine and cached
        (:meth:`laser.vllm.calibrate.Calibration.measure`)."""
        calibration = self._calibration("the step-cost model is measured through the laser proposer")
        return calibration.measure(self.cost_key(), remeasure, rows, lens, context, repeats)

    def warm_shapes(self, rows: Sequence[int], lens: Sequence[int] = CALIBRATION_LENS, context: int = 64) -> None:
        """Run every (rows x draft length) step shape once, untimed (:meth:`laser.vllm.calibrate.Calibration.warm`)."""
        self._calibration("warm_shapes drafts through the laser proposer").warm(rows, lens, context)

    def _calibration(self, what: str) -> calibrate.Calibration:
        if self.proposer is None:
            raise ValueError(f"{what} (speculation='laser', engine core in this process)")
        return calibrate.Calibration(self._vllm, self.proposer, self.max_draft, self.max_num_seqs)

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

    def _find_proposer(self) -> LaserProposer | None:
        """This engine's laser proposer (its model runner's drafter, through vLLM's ``collective_rpc``), or None
        when vLLM runs its engine core in another process (the proposer lives there: per-request stats
        then come from vLLM's ``spec_decode_metrics``, see :meth:`laser.vllm.proposer.RowStats.from_spec_metrics`)."""
        from vllm.v1.engine.core_client import InprocClient

        from laser.vllm.proposer import LaserProposer

        llm = self._vllm
        if not isinstance(llm.llm_engine.engine_core, InprocClient):
            return None
        if llm.llm_engine.vllm_config.parallel_config.world_size > 1:  # each rank's own, in its process
            return None
        found = llm.collective_rpc(lambda worker: getattr(worker.model_runner, "drafter", None))
        prop = found[0] if found else None
        if not isinstance(prop, LaserProposer):
            raise RuntimeError(f"vLLM built no laser proposer (its drafter is {type(prop).__name__})")
        return prop


def _ask_spec_metrics(vllm_kwargs: dict[str, Any]) -> None:
    """Ask vLLM for per-request spec-decoding metrics (how a proposer in another process reports each
    request's drafts): vLLM 0.29+ has them; before, such a request's ``VllmResult.stats`` is None."""
    if installed_has("per_request_spec_decode_metrics"):
        vllm_kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
    else:
        log.warning(
            "this vLLM has no per-request spec-decoding metrics (vLLM 0.29+): with the engine core in another "
            "process, results carry no draft statistics"
        )


def _say(on_start: Callable[[str], None] | None, line: str) -> None:
    log.info("%s", line)
    if on_start is not None:
        on_start(line)


def _checked_sampling(verification: str, sampling: dict[str, Any] | None) -> dict[str, Any]:
    """A request's sampling with its defaults (greedy), refused where ``verification`` cannot honour it."""
    if verification not in ("greedy", "relaxed"):
        raise ValueError(f"verification must be 'greedy' or 'relaxed', got {verification!r}")
    s = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, **(sampling or {})}
    if verification == "relaxed" and s["temperature"] > 0:
        raise ValueError("relaxed verification is deterministic: it needs temperature 0")
    return s


def _vllm_params(
    max_new_tokens: int,
    s: dict[str, Any],
    stops: list[str],
    ignore_eos: bool,
    args: LaserArgs,
    cumulative: bool,
    **rule_kw: Any,
) -> SamplingParams:
    """vLLM's sampling parameters of one request: its sampling ``s``, stops, LASER arguments and rules;
    ``cumulative``: every step's output (a halt checks it), else the final one only."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_new_tokens,
        temperature=float(s["temperature"]),
        top_p=float(s["top_p"]),
        top_k=int(s["top_k"] or 0),
        seed=s["seed"] if s["temperature"] > 0 else None,
        stop=stops or None,
        ignore_eos=ignore_eos,
        extra_args=args.to_extra_args(),
        output_kind=RequestOutputKind.CUMULATIVE if cumulative else RequestOutputKind.FINAL_ONLY,
        **rule_kw,
    )


def _check_draft_len(draft_len: object) -> None:
    if draft_len != "auto" and (isinstance(draft_len, bool) or not isinstance(draft_len, int) or draft_len < 0):
        raise ValueError(f"draft_len must be 'auto' or an integer >= 0, got {draft_len!r}")
