"""The vLLM engine's step-cost calibration: a :class:`laser.cost.ForwardCost` table of whole engine steps.

The table the proposer's chain budget starts from (:func:`start_cost`) is the one measured on this machine
(:meth:`Calibration.measure`, cached under :func:`laser.cost.cost_cache_dir` by :func:`step_cost_key`)
when there is one, else the shipped prior scaled to the model (:func:`laser.vllm.step_cost.prior_cost`);
the budget corrects it online either way (:class:`laser.vllm.step_cost.StepCost`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from laser.cost import ForwardCost, cost_cache_dir
from laser.vllm.env import device_name
from laser.vllm.step_cost import prior_cost

if TYPE_CHECKING:
    from vllm import LLM

    from laser.vllm.proposer import LaserProposer

log = logging.getLogger(__name__)

CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION_LENS = (0, 1, 2, 4, 8, 16)
_PASSES = itertools.count(1)  # each calibration pass gets prompts of its own (no prefix-cache hits)


def step_cost_key(model_path: str, dtype: str, threads: int | None, max_draft: int) -> str:
    """What a measured step-cost table depends on: model shape, dtype, device (``cpu`` or the CUDA
    device's name), threads, cores, vLLM version and the longest chain."""
    import vllm

    cfg = json.loads((Path(model_path) / "config.json").read_text())
    parts = [
        cfg.get("architectures"),
        cfg.get("hidden_size"),
        cfg.get("num_hidden_layers"),
        cfg.get("vocab_size"),
        dtype,
        threads,
        os.cpu_count(),
        vllm.__version__,
        max_draft,
        "vllm-step",
        device_name(),
    ]
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def cached_cost(key: str) -> ForwardCost | None:
    """The step-cost table measured earlier under ``key``, or None (an unreadable one is logged)."""
    path = cost_cache_dir() / f"{key}.json"
    if not path.exists():
        return None
    try:
        return ForwardCost.load(path)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("step-cost table %s unreadable (%s); using the prior", path, exc)
        return None


def start_cost(model_path: str, threads: int | None, key: str) -> ForwardCost:
    """The table measured on this machine under ``key`` if any, else the shipped prior scaled to the model
    at ``model_path`` and ``threads``. Nothing is measured here."""
    cost = cached_cost(key)
    if cost is None:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        cost = prior_cost(cfg, threads, key=f"prior:{key}")
        log.info(
            "step cost: the shipped prior scaled to this model (no measured table for key %s); it is corrected online",
            key,
        )
    return cost


class Calibration:
    """Times the steps of a running vLLM engine through its laser proposer (in this process).

    Args:
        llm: the engine's ``vllm.LLM``.
        proposer: its laser proposer (the engine core in this process).
        max_draft: the longest chain (vLLM's ``num_speculative_tokens``).
        max_num_seqs: requests vLLM keeps in flight (the most rows a step can have).
    """

    def __init__(self, llm: LLM, proposer: LaserProposer, max_draft: int, max_num_seqs: int) -> None:
        self.llm, self.proposer = llm, proposer
        self.max_draft, self.max_num_seqs = max_draft, max_num_seqs

    def measure(
        self,
        key: str,
        remeasure: bool = False,
        rows: Sequence[int] = CALIBRATION_ROWS,
        lens: Sequence[int] = CALIBRATION_LENS,
        context: int = 256,
        repeats: int = 5,
    ) -> ForwardCost:
        """Seconds of one vLLM step against rows x tokens per row, cached under ``key``.

        Each row count runs that many requests whose proposer drafts a fixed number of junk tokens
        (rejected, so every row stays one token per step) cycling through ``lens``; the wall time
        between successive ``propose`` calls of identical batches is one step (scheduler, forward,
        verification, drafting); the median of ``repeats`` is kept. A first, untimed pass meets every
        shape once (the first step of a new shape pays for kernel selection on CPU: 0.1-0.2 s).
        """
        lens = [L for L in lens if L <= self.max_draft]
        rows = [r for r in rows if r <= self.max_num_seqs]
        path = cost_cache_dir() / f"{key}.json"
        if path.exists() and not remeasure:
            cost = ForwardCost.load(path)
            if cost.rows == list(rows) and cost.nodes == [L + 1 for L in lens]:
                return cost
        log.info("measuring the vLLM step cost model (%d row counts; cached for the next run)", len(rows))
        self.warm(rows, lens, context)
        table: list[list[float]] = []
        measured: dict[str, float] = {}
        for b in rows:
            times = self._time_steps(b, lens, context, repeats)
            row = []
            for L in lens:
                ts = sorted(times.get((b, L), []))
                sec = ts[len(ts) // 2] if ts else float("nan")
                measured[f"{b}x{L + 1}"] = sec
                row.append(sec)
            table.append(row)
        cost = ForwardCost(
            key=key,
            rows=list(rows),
            nodes=[L + 1 for L in lens],
            seconds=fill_untimed(table),
            context=context,
            measured=measured,
        )
        cost.save(path)
        return cost

    def warm(self, rows: Sequence[int], lens: Sequence[int] = CALIBRATION_LENS, context: int = 64) -> None:
        """Run every (rows x draft length) step shape once, untimed: the first step of a new shape pays for
        kernel selection, which a measurement (or a benchmark) should not count."""
        for b in rows:
            self._time_steps(b, [L for L in lens if L <= self.max_draft], context, 1)

    def _time_steps(
        self, b: int, lens: Sequence[int], context: int, repeats: int
    ) -> dict[tuple[int, int], list[float]]:
        """``b`` requests drafting junk of each length in ``lens`` in turn; step times by (rows, length)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        serial = next(_PASSES)
        steps = 2 + repeats * len(lens)
        prompts, params = [], []
        for i in range(b):
            ids = [(17 + 31 * (i * context + j) + 7 * serial) % (vocab - 10) + 5 for j in range(context)]
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
        with self.proposer.calibrating(lens) as step_log:
            self.llm.generate(prompts, params, use_tqdm=False)
            return dict(step_log.times)


def fill_untimed(table: list[list[float]]) -> list[list[float]]:
    """Give shapes with no timing (NaN) the seconds of the nearest timed shape of the same row count."""
    out = []
    for row in table:
        good = [(j, t) for j, t in enumerate(row) if not math.isnan(t)]
        if not good:
            raise RuntimeError("the step-cost measurement timed no step; is the machine overloaded?")
        out.append([t if not math.isnan(t) else min(good, key=lambda g: abs(g[0] - j))[1] for j, t in enumerate(row)])
    return out
