"""The hf engine's tree budget: each step, the tree size that maximises the batch's expected tokens per
second, from the forward cost model and every row's running acceptance by depth. (The vLLM proposer's
per-row chain lengths are :mod:`laser.vllm.chain_budget`; it starts from the same ``OPTIMISM``.)

Trees of one step are padded to a common width, so the forward costs ``rows x (budget + 1)`` tokens
whatever each row drafts: the policy picks one budget per step. A row's expected accepted tokens
under a budget ``b`` is ``sum_{d <= depth(b)} prod_{j <= d} alpha_j``, where ``alpha_j`` is the row's rate
of accepting depth j when verification reached depth j - 1 (shrunk towards the engine-wide rate), and
``depth(b)`` the depth a tree of b nodes reaches (b over the trees' running width, at most the deepest
tree the row's drafter gave). The policy then maximises

    (rows + sum_i E_i(b)) / (forward_seconds(rows, b + 1) + per-step overhead)

over a ladder of budgets. When the forward is compute-bound, wider forwards cost in proportion and
the budget falls to zero: speculation turns itself off. When compute is idle and acceptance is high,
trees grow. Before any evidence the engine-wide acceptance is assumed high (``OPTIMISM``), so the first
steps draft and measure; while speculation is off, one step in ``PROBE_EVERY`` drafts a little, so the
estimates follow the data (a probe costs at most one wider forward in 32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from laser.cost import ForwardCost
from laser.request import Request
from laser.tree import DraftTree
from laser.verify import Outcome

LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_DEPTH = 64
OPTIMISM = 0.8  # the engine-wide acceptance assumed before any evidence (two steps' worth; both engines)
PROBE_EVERY = 32  # after this many steps without drafting, one step drafts PROBE_BUDGET to refresh the estimates
PROBE_BUDGET = 4


class BudgetPolicy(Protocol):
    """Sets ``Request.budget`` of every active row before a step and learns from its outcome."""

    def assign(self, requests: Sequence[Request]) -> None: ...

    def observe(
        self,
        requests: Sequence[Request],
        trees: Sequence[DraftTree],
        outcomes: Sequence[Outcome],
        step_s: float,
        forward_s: float,
    ) -> None: ...

    def forget(self, request: Request) -> None: ...


@dataclass
class _DepthCounts:
    """How often verification reached each depth and how often it accepted it (index = depth)."""

    reached: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DEPTH + 1))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(MAX_DEPTH + 1))
    deepest: int = MAX_DEPTH  # deepest tree the drafter gave when asked for more than it had

    def add(self, tree_depth: int, accepted: int) -> None:
        top = min(tree_depth, accepted + 1)
        self.reached[1 : top + 1] += 1
        self.accepted[1 : min(accepted, top) + 1] += 1


class AdaptiveBudget:
    """The budget policy of the continuous engine (see the module docstring).

    Args:
        cost: the forward cost model of this device, model, dtype and threads, or a function that
            returns it (measured on first use, so building a decoder costs no measurement).
        max_budget: the largest tree (draft nodes) ever chosen.
        prior: weight, in steps, of the engine-wide acceptance in each row's estimate.
    """

    def __init__(self, cost: ForwardCost | Callable[[], ForwardCost], max_budget: int = 64, prior: float = 4.0):
        self._cost = cost
        self.ladder = [b for b in LADDER if b <= max_budget]
        self.prior = prior
        self.all = _DepthCounts()
        self.rows: dict[int, _DepthCounts] = {}
        self.width = 1.0  # draft nodes per depth level of recent trees
        self.overhead_s = 0.0  # per-step seconds outside the forward (drafting, packing, verification)
        self.idle_steps = 0  # consecutive steps without drafting
        self.chosen: list[int] = []  # the budget of every step, for reports
        self.predicted: list[float] = []  # the predicted tokens/s of every step's choice

    @property
    def cost(self) -> ForwardCost:
        if not isinstance(self._cost, ForwardCost):
            self._cost = self._cost()
        return self._cost

    def expected(self, request: Request, budget: int) -> float:
        """Expected accepted draft tokens of ``request`` with ``budget`` draft nodes."""
        row = self.rows.get(id(request)) or _DepthCounts()
        depth = min(math.ceil(budget / self.width), row.deepest, MAX_DEPTH)
        if depth <= 0:
            return 0.0
        base = (self.all.accepted[1 : depth + 1] + 2 * OPTIMISM) / (self.all.reached[1 : depth + 1] + 2)
        alpha = (row.accepted[1 : depth + 1] + self.prior * base) / (row.reached[1 : depth + 1] + self.prior)
        return float(np.cumprod(alpha).sum())

    def throughput(self, requests: Sequence[Request], budget: int) -> float:
        """Predicted tokens per second of one step of ``requests`` with ``budget`` draft nodes each."""
        tokens = len(requests) + sum(self.expected(r, budget) for r in requests)
        return tokens / (self.cost.time(len(requests), budget + 1) + self.overhead_s)

    def assign(self, requests: Sequence[Request]) -> None:
        rates = [self.throughput(requests, b) for b in self.ladder]
        best = int(np.argmax(rates))
        budget = self.ladder[best]
        # estimates only change when something is drafted: probe now and then while speculation is off
        self.idle_steps = self.idle_steps + 1 if budget == 0 else 0
        if self.idle_steps >= PROBE_EVERY and self.ladder[-1] > 0:
            budget, self.idle_steps = min(PROBE_BUDGET, self.ladder[-1]), 0
        for r in requests:
            r.budget = budget
        self.chosen.append(budget)
        self.predicted.append(rates[best])

    def observe(
        self,
        requests: Sequence[Request],
        trees: Sequence[DraftTree],
        outcomes: Sequence[Outcome],
        step_s: float,
        forward_s: float,
    ) -> None:
        overhead = max(step_s - forward_s, 0.0)  # a running mean after the first step (which sets it)
        self.overhead_s = overhead if len(self.chosen) <= 1 else 0.8 * self.overhead_s + 0.2 * overhead
        for r, tree, o in zip(requests, trees, outcomes):
            row = self.rows.setdefault(id(r), _DepthCounts())
            drafted, depth = len(tree) - 1, int(tree.depth.max())
            if r.budget is not None and drafted < r.budget:  # the drafter had no more to give
                row.deepest = depth
            elif depth > 0:
                row.deepest = MAX_DEPTH  # it gave all it was asked: it may have more
            if depth == 0 and not r.budget:
                continue  # nothing was asked: nothing learnt
            accepted = max(len(o.path) - 1, 0)  # an empty tree counts as depth 1 not accepted
            row.add(max(depth, 1), accepted)
            self.all.add(max(depth, 1), accepted)
            if depth:
                self.width = 0.9 * self.width + 0.1 * (drafted / depth)

    def forget(self, request: Request) -> None:
        self.rows.pop(id(request), None)
