"""The vLLM step's cost: a :class:`laser.cost.ForwardCost` table corrected online (:class:`StepCost`).

The two engines share one table type, :class:`laser.cost.ForwardCost` (seconds against rows x tokens
per row, measured once per machine and cached): the hf engine times tree forwards
(:func:`laser.cost.forward_cost`), the vLLM engine times whole engine steps
(:mod:`laser.vllm.calibrate`). This module is the vLLM layer on top of that table: :class:`StepCost`, the
table corrected from the steps the engine runs (what the proposer's chain budget,
:class:`laser.vllm.chain_budget.ChainBudget`, prices draft tokens with), and the shipped prior table
(:func:`prior_cost`, ``cost_prior.json``: SmolLM2-135M on a 2-core CPU, scaled to the model and threads)
used where nothing was measured.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from laser.cost import ForwardCost

# the prior's pull (times StepCost.prior_steps) on the step cost's scale, overhead and price of a draft
# token: weak on the level and weakest on the overhead, which gives way first, so a step dearer than the
# table says is taken for a fixed cost until steps of other widths and with drafts tell the price of a token
PRIOR_WEIGHTS = (1 / 16, 1 / 256, 1 / 4)
TRUST_AFTER = 8  # steps learned before the fit bounds what one step can teach it (a stall)
PRIOR_FILE = Path(__file__).with_name("cost_prior.json")


def matmul_params(config: dict[str, Any]) -> float:
    """Weights one token multiplies through (attention, MLP, LM head): a rough step-cost scale."""
    h = float(config.get("hidden_size") or 0)
    layers = float(config.get("num_hidden_layers") or 0)
    heads = float(config.get("num_attention_heads") or 1)
    kv = float(config.get("num_key_value_heads") or heads)
    inter = float(config.get("intermediate_size") or 4 * h)
    head_dim = float(config.get("head_dim") or h / heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    return layers * (attn + 3 * h * inter) + float(config.get("vocab_size") or 0) * h


def prior_cost(config: dict[str, Any], threads: int | None, key: str = "prior", path: Path = PRIOR_FILE) -> ForwardCost:
    """The shipped step-cost table scaled to a model (``config``: its config.json) and thread count.

    The scale is rough on purpose: the table was timed on one model and machine; seconds grow with the
    weights a token passes through and fall with threads (to the power 0.8: two cores do not halve a
    step). Only the ratio of tokens to time matters to the budget, and :class:`StepCost` corrects the
    level and the price of a token from the first steps the engine runs.
    """
    prior = json.loads(path.read_text())
    ratio = matmul_params(config) / matmul_params(prior["config"])
    threads = threads or os.cpu_count() or 1
    factor = max(ratio, 0.05) * (prior["threads"] / threads) ** 0.8
    seconds = [[t * factor for t in row] for row in prior["seconds"]]
    return ForwardCost(
        key=key,
        rows=list(prior["rows"]),
        nodes=list(prior["nodes"]),
        seconds=seconds,
        context=prior.get("context", 256),
        measured={},
    )


@dataclass
class StepCost:
    """Seconds of one vLLM step: a table (measured or prior) corrected online from the steps the engine ran.

    ``seconds(rows, drafts) = max(scale * table(rows, 1 + drafts / rows) + per_token * drafts,
    scale * table(rows, 1)) + overhead`` (a draft never makes a step cheaper), with ``scale``,
    ``overhead`` (the seconds every step costs beyond the table's, or below it) and ``per_token`` fitted
    by least squares on relative error, old steps forgotten at ``memory`` per step, and a prior of
    ``prior_steps`` steps pulling towards the table as it is (scale 1, overhead 0, per_token 0). Steps
    of different widths tell the fixed cost from the price of a token, so a machine whose steps have a
    larger fixed part than the table's (a slower scheduler, memory-bound weights) does not see draft
    tokens as dear. Proposer seconds per row are running means of their own (``propose_s``), for
    drafting and non-drafting steps.

    Args:
        table: step seconds against rows x tokens per row.
        memory: weight kept by earlier steps at each new one (0.98: about the last 50 steps count).
        prior_steps: how many steps' worth of evidence the table itself is worth.
    """

    table: ForwardCost
    memory: float = 0.98
    prior_steps: float = 4.0
    scale: float = 1.0
    overhead: float = 0.0  # seconds every step costs beyond the table's
    per_token: float = 0.0  # seconds per draft token beyond the table's own price
    steps: int = 0  # steps learned from
    propose_s: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})  # drafting? -> s per row

    def __post_init__(self) -> None:
        self._unit = float(self.table.time(1, 1)) or 1e-3  # makes per_token dimensionless in the fit
        self._a = np.zeros((3, 3))
        self._b = np.zeros(3)
        self._propose_n = {True: 0.0, False: 0.0}

    def seconds(self, rows: int, drafts: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Predicted seconds of steps of ``rows`` rows with ``drafts`` (an array) draft tokens in all,
        proposer excluded (see :meth:`drafting`)."""
        tokens = np.asarray(drafts, dtype=float)
        rows = max(int(rows), 1)
        base = self.table.times(rows, 1.0 + tokens / rows)
        flat = self.scale * float(self.table.time(rows, 1))
        out: npt.NDArray[np.float64] = np.maximum(self.scale * base + self.per_token * tokens, flat) + self.overhead
        return out

    def drafting(self, rows: int, on: bool) -> float:
        """Proposer seconds of a step of ``rows`` rows that drafts (``on``) or does not."""
        return self.propose_s[bool(on)] * rows

    def observe(
        self, rows: int, drafts: int, seconds: float, propose_s: float = 0.0, drafting: bool | None = None
    ) -> None:
        """Learn from one step that ran: ``seconds`` without the proposer, ``propose_s`` the proposer's."""
        if rows <= 0 or not np.isfinite(seconds) or seconds <= 0:
            return
        on = drafts > 0 if drafting is None else bool(drafting)
        if propose_s >= 0 and np.isfinite(propose_s):
            n = self._propose_n[on] = min(self._propose_n[on] + 1, 1 / (1 - self.memory))
            self.propose_s[on] += (propose_s / rows - self.propose_s[on]) / n
        base = float(self.table.time(rows, 1 + drafts / rows))
        predicted = float(self.seconds(rows, drafts))
        if self.steps >= TRUST_AFTER:  # one stalled step does not swing a fit that has seen a few
            seconds = min(max(seconds, predicted / 4), predicted * 4)
        y = seconds / base
        x = np.array([1.0, self._unit / base, drafts * self._unit / base])
        self._a = self.memory * self._a + np.outer(x, x)
        self._b = self.memory * self._b + x * y
        pull = self.prior_steps * np.array(PRIOR_WEIGHTS)  # towards scale 1, overhead 0, per_token 0
        theta = np.linalg.solve(self._a + np.diag(pull), self._b + pull * np.array([1.0, 0.0, 0.0]))
        self.scale = float(max(theta[0], 0.05))
        self.overhead = float(max(theta[1] * self._unit, -0.5 * self.scale * self._unit))  # steps stay > 0
        self.per_token = float(theta[2] * self._unit)
        self.steps += 1
