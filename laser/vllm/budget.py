"""Draft lengths that follow the load, for vLLM's ragged chain batches.

vLLM flattens a step's rows into one ragged batch: the forward costs ``rows + sum_i L_i`` tokens, not a
padded width, so every row gets its own draft length L_i. With ``alpha_{i,d}`` row i's rate of accepting
depth d once verification reached d - 1 (shrunk towards the engine-wide rate, as in
:mod:`laser.budget`), the d-th draft token of row i adds ``g_{i,d} = prod_{j<=d} alpha_{i,j}`` expected
tokens, and g falls with d. So for a total of T draft tokens the best split takes the T largest
gains, and the policy picks the T that maximises

    (rows + sum of the T largest gains) / step_seconds(rows, 1 + T / rows)

from a cost model measured on the vLLM step (:func:`laser.vllm.engine.VllmEngine.measure_cost`; the
same :class:`laser.cost.ForwardCost` table as our engine, nodes = tokens per row). When the step is
compute-bound extra tokens cost in proportion and T falls to 0: speculation switches itself off.
While it is off, one step in ``PROBE_EVERY`` drafts a little so the estimates follow the data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from laser.cost import ForwardCost

OPTIMISM = 0.8  # engine-wide acceptance assumed before any evidence
PROBE_EVERY = 32
PROBE_LEN = 2


@dataclass
class _Depths:
    reached: np.ndarray
    accepted: np.ndarray

    @classmethod
    def zeros(cls, n: int) -> "_Depths":
        return cls(np.zeros(n + 1), np.zeros(n + 1))

    def add(self, drafted: int, accepted: int) -> None:
        top = min(drafted, accepted + 1)
        self.reached[1:top + 1] += 1
        self.accepted[1:min(accepted, top) + 1] += 1


@dataclass
class ChainBudget:
    """Per-row draft lengths for one step (``fixed`` set: always that length, capped by what is available).

    Args:
        cost: seconds of one vLLM step against rows x tokens per row (None: only ``fixed`` works).
        max_len: the longest chain (vLLM's ``num_speculative_tokens``).
        fixed: a fixed length for studies, or None for lengths that follow the load.
        prior: weight, in steps, of the engine-wide acceptance in each row's estimate.
    """

    cost: ForwardCost | None
    max_len: int
    fixed: int | None = None
    prior: float = 4.0
    rows: dict = field(default_factory=dict)
    idle_steps: int = 0
    chosen: list = field(default_factory=list)  # total draft tokens of each step, for reports

    def __post_init__(self) -> None:
        self.all = _Depths.zeros(self.max_len)
        if self.fixed is None and self.cost is None:
            raise ValueError("draft length 'auto' needs a cost model; pass one or a fixed length")

    def gains(self, key: Hashable) -> np.ndarray:
        """``[max_len]`` expected tokens added by a row's 1st, 2nd, ... draft token."""
        row = self.rows.get(key) or _Depths.zeros(self.max_len)
        base = (self.all.accepted[1:] + 2 * OPTIMISM) / (self.all.reached[1:] + 2)
        alpha = (row.accepted[1:] + self.prior * base) / (row.reached[1:] + self.prior)
        return np.cumprod(alpha)

    def lengths(self, keys: Sequence[Hashable], available: Sequence[int]) -> list[int]:
        """Draft length of each row this step; row i never gets more than ``available[i]``."""
        avail = np.minimum(np.asarray(available, dtype=int), self.max_len)
        if self.fixed is not None:
            return np.minimum(avail, self.fixed).tolist()
        n = len(keys)
        if n == 0 or not avail.any():
            return [0] * n
        g = np.stack([self.gains(k) for k in keys])  # [rows, max_len]
        g[np.arange(self.max_len)[None, :] >= avail[:, None]] = -1.0  # beyond what the drafter has
        order = np.argsort(-g, axis=None, kind="stable")
        flat = g.reshape(-1)[order]
        flat = flat[flat >= 0]
        totals = np.arange(len(flat) + 1)
        expected = np.concatenate([[0.0], np.cumsum(flat)])
        seconds = np.array([self.cost.time(n, 1 + t / n) for t in totals])
        rate = (n + expected) / seconds
        best = int(np.argmax(rate))
        self.idle_steps = self.idle_steps + 1 if best == 0 else 0
        if self.idle_steps >= PROBE_EVERY:
            self.idle_steps = 0
            return np.minimum(avail, PROBE_LEN).tolist()
        taken = np.zeros(g.size, dtype=int)
        taken[order[:best]] = 1
        self.chosen.append(best)
        return taken.reshape(g.shape).sum(1).tolist()

    def observe(self, key: Hashable, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.rows.setdefault(key, _Depths.zeros(self.max_len)).add(drafted, accepted)
        self.all.add(drafted, accepted)

    def forget(self, key: Hashable) -> None:
        self.rows.pop(key, None)
