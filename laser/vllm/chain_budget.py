"""The chain budget of LASER's vLLM proposer: draft lengths that follow the load, for vLLM's ragged chains.

(The hf engine's tree budget, one padded width per step, is :mod:`laser.budget`; both price drafts on
the same :class:`laser.cost.ForwardCost` table type and start from the same acceptance prior,
:data:`laser.budget.OPTIMISM`.)

vLLM flattens a step's rows into one ragged batch: the forward costs ``rows + sum_i L_i`` tokens, not a
padded width, so every row gets its own draft length L_i. With ``alpha_{i,d}`` row i's rate of accepting
depth d once verification reached d - 1, the d-th draft token of row i adds
``g_{i,d} = prod_{j<=d} alpha_{i,j}`` expected tokens, and g falls with d.

Acceptance depends most on how long a suffix of the row's text the drafter matched this step (its
``match_length``: a draft that continues a long match is accepted far more often than one that
continues a single token). So the rates are kept by *match bucket* (1, 2, ..., ``BUCKETS - 1`` or more
tokens; bucket 0 for drafters that do not say): ``alpha_{i,d}`` is row i's own rate in its current
bucket shrunk towards the engine-wide rate of that bucket (as in :mod:`laser.budget`). A row whose
drafter matched nothing gets no draft.

For a total of T draft tokens the best split takes the T largest gains, and the policy picks the T that
maximises

    (rows + sum of the T largest gains) / (step_seconds(rows, T) + drafting_seconds(rows, T > 0))

All of it is array arithmetic: one sort of the stacked gains, one cost evaluation over every candidate T.

The step cost (:class:`laser.vllm.step_cost.StepCost`) starts from a table of step seconds against rows
x tokens per row (the same :class:`laser.cost.ForwardCost` as the hf engine, nodes = 1 + draft tokens per
row): the one measured on this machine (:func:`laser.vllm.calibrate.measure_cost`, cached) or else the
shipped prior (:func:`laser.vllm.step_cost.prior_cost`). It then learns from the steps the engine runs
(:meth:`ChainBudget.observe_step`): a forgetting least-squares fit of ``seconds = scale * table(rows, tokens) + overhead + per_token *
drafts`` (so the level, the fixed cost of a step and the price of a token all follow the machine as it
is now: a step's tokens, the rows' and the drafts' alike, price a draft token) plus the proposer's
own seconds per row, kept apart for steps that draft and steps that do not. A draft token pays only
when its expected tokens beat what it costs, proposer included.

When the step is compute-bound extra tokens cost in proportion and T falls to 0: speculation switches
itself off. While prompts are prefilled in chunks (a wave of arrivals larger than a step's token
budget), the steps are full of prompt tokens and no row drafts (:meth:`ChainBudget.lengths`).
Switching is damped (hysteresis): it switches off after ``OFF_AFTER`` steps in a row whose
best T is 0 and back on after ``ON_AFTER`` steps in a row where drafting beats not drafting by
``ON_MARGIN``. While it is off, one step in ``PROBE_EVERY`` drafts ``PROBE_LEN`` tokens on at most
``PROBE_ROWS`` rows (the rows probed longest ago first), so the acceptance estimates follow the data
without a whole-batch wider step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from laser.budget import OPTIMISM  # the engine-wide acceptance assumed before any evidence (both engines)
from laser.cost import ForwardCost
from laser.vllm.step_cost import StepCost

PROBE_EVERY = 8  # while drafting is off, one step in this many probes
PROBE_ROWS = 2  # rows a probe step drafts on
PROBE_LEN = 2  # draft tokens a probed row gets
OFF_AFTER = 3  # steps in a row whose best total is 0 before drafting switches off
ON_AFTER = 2  # steps in a row where drafting wins by ON_MARGIN before it switches back on
ON_MARGIN = 0.02
BUCKETS = 5  # match buckets: 0 (not said), 1, 2, 3, 4 or more tokens


def bucket(match: int | None) -> int:
    """The match bucket of a drafter's match length (None: not said)."""
    return 0 if match is None else min(max(int(match), 1), BUCKETS - 1)


@dataclass
class ChainBudget:
    """Per-row draft lengths for one step (``fixed`` set: always that length, capped by what is available).

    Args:
        cost: seconds of one vLLM step against rows x tokens per row, measured or the prior (None: only
            ``fixed`` works); corrected online by :meth:`observe_step` unless ``learn`` is False.
        max_len: the longest chain (vLLM's ``num_speculative_tokens``).
        fixed: a fixed length for studies, or None for lengths that follow the load.
        prior: weight, in steps, of the engine-wide acceptance in each row's estimate.
        learn: correct the step cost from the steps the engine runs.
    """

    cost: ForwardCost | None
    max_len: int
    fixed: int | None = None
    prior: float = 4.0
    learn: bool = True
    chosen: list[int] = field(default_factory=list)  # total draft tokens of each step, for reports
    on: bool = True  # drafting on (lengths from the model) or off (probes only)

    def __post_init__(self) -> None:
        if self.fixed is None and self.cost is None:
            raise ValueError("draft length 'auto' needs a cost model; pass one or a fixed length")
        self.step_cost: StepCost | None = StepCost(self.cost) if self.cost is not None else None
        n = self.max_len + 1
        self._all = np.zeros((2, BUCKETS, n))  # engine-wide [reached, accepted] by match bucket and depth
        self._reached = np.zeros((8, BUCKETS, n))  # slot 0: a row never observed (all zeros)
        self._accepted = np.zeros((8, BUCKETS, n))
        self._slot: dict[Hashable, int] = {}
        self._bucket: dict[Hashable, int] = {}  # row -> match bucket of its last draft
        self._free: list[int] = list(range(7, 0, -1))
        self._streak = 0  # steps in a row pointing at the other state
        self._off_steps = 0
        self._probed: dict[Hashable, int] = {}  # row -> step it was last probed
        self._steps = 0
        self._last_on = True

    # acceptance ---------------------------------------------------------------------------------
    def _gains(self, slots: npt.NDArray[np.int_], buckets: npt.NDArray[np.int_]) -> npt.NDArray[np.float64]:
        base = (self._all[1, buckets, 1:] + 2 * OPTIMISM) / (self._all[0, buckets, 1:] + 2)
        alpha = (self._accepted[slots, buckets, 1:] + self.prior * base) / (
            self._reached[slots, buckets, 1:] + self.prior
        )
        return np.asarray(np.cumprod(alpha, axis=-1), dtype=np.float64)

    def gains(self, key: Hashable, match: int | None = None) -> npt.NDArray[np.float64]:
        """``[max_len]`` expected tokens added by a row's 1st, 2nd, ... draft token at a match of ``match``
        tokens (None: not said)."""
        row: npt.NDArray[np.float64] = self._gains(np.array([self._slot.get(key, 0)]), np.array([bucket(match)]))[0]
        return row

    def observe(self, key: Hashable, drafted: int, accepted: int) -> None:
        """Row ``key`` drafted ``drafted`` tokens last step (at the match :meth:`lengths` was told) and
        ``accepted`` of them were accepted."""
        if drafted <= 0:
            return
        b = self._bucket.get(key, 0)
        slot = self._slot.get(key)
        if slot is None:
            if not self._free:
                grow = len(self._reached)
                self._reached = np.vstack([self._reached, np.zeros_like(self._reached)])
                self._accepted = np.vstack([self._accepted, np.zeros_like(self._accepted)])
                self._free = list(range(2 * grow - 1, grow - 1, -1))
            slot = self._slot[key] = self._free.pop()
        top = min(drafted, accepted + 1, self.max_len)
        hit = min(accepted, top)
        for arr in (self._reached[slot, b], self._all[0, b]):
            arr[1 : top + 1] += 1
        for arr in (self._accepted[slot, b], self._all[1, b]):
            arr[1 : hit + 1] += 1

    def forget(self, key: Hashable) -> None:
        """Row ``key`` left the batch."""
        self._probed.pop(key, None)
        self._bucket.pop(key, None)
        slot = self._slot.pop(key, None)
        if slot is not None:
            self._reached[slot] = 0
            self._accepted[slot] = 0
            self._free.append(slot)

    # cost -----------------------------------------------------------------------------------------
    def observe_step(self, rows: int, tokens: int, seconds: float, propose_s: float = 0.0) -> None:
        """Learn the step cost from a step that ran.

        Args:
            rows: rows (requests) of the step that decoded, i.e. got a token.
            tokens: tokens those rows put through the forward: ``rows`` + the draft tokens they verified.
            seconds: wall seconds of the step without the proposer: from the return of the ``propose``
                call that drafted it to the start of the next ``propose`` call (scheduler, forward,
                verification, sampling).
            propose_s: seconds of that ``propose`` call (retrieval, tree to chain, this budget).

        Steps with a prefill in them, or more tokens than ``rows * (1 + max_len)``, teach nothing about
        decoding and are skipped.
        """
        if self.step_cost is None or not self.learn or rows <= 0:
            return
        drafts = int(tokens) - int(rows)
        if drafts < 0 or drafts > rows * self.max_len:
            return
        self.step_cost.observe(int(rows), drafts, float(seconds), float(propose_s), drafting=self._last_on)

    def rates(self, n: int, expected: npt.NDArray[np.float64], fixed: int = 0) -> npt.NDArray[np.float64]:
        """Expected tokens per second of a step of ``n`` rows for each total T (``expected[T]``: the
        expected accepted drafts of the step with the T best draft tokens) beside ``fixed`` draft tokens
        of rows with a fixed length (in every total's cost)."""
        cost = self.step_cost
        if cost is None:
            raise ValueError("draft length 'auto' needs a cost model; pass one or a fixed length")
        totals = np.arange(len(expected))
        seconds = cost.seconds(n, totals + fixed)
        seconds = seconds + np.where(totals + fixed > 0, cost.drafting(n, True), cost.drafting(n, False))
        return np.asarray((n + expected) / seconds, dtype=np.float64)

    # lengths ---------------------------------------------------------------------------------------
    def lengths(
        self,
        keys: Sequence[Hashable],
        available: Sequence[int],
        matches: Sequence[int | None] | None = None,
        prefilling: bool = False,
        fixed: Sequence[int | None] | None = None,
    ) -> list[int]:
        """Draft length of each row this step; row i never gets more than ``available[i]``.

        ``matches[i]``: how many tokens of row i's text its drafter matched (0: it has nothing to draft;
        None, or no ``matches``: not said). ``prefilling``: prompts are still being prefilled in chunks,
        so the next step's token budget is full of them; a draft token would take a prompt token's place
        and delay every row still waiting for its first token, so no row drafts (a fixed length still
        does). ``fixed[i]``: row i's own fixed length (its request asked for one), None: the budget's
        choice (or the budget's ``fixed``); the budget chooses for the other rows with those drafts counted
        in the step's cost."""
        avail = np.minimum(np.asarray(available, dtype=int).reshape(-1), self.max_len)
        n = len(keys)
        buckets = np.zeros(n, dtype=int)
        if matches is not None:
            buckets = np.fromiter((bucket(m) for m in matches), dtype=int, count=n)
            avail = np.where(np.array([m == 0 for m in matches], dtype=bool), 0, avail)
            self._bucket.update(zip(keys, buckets.tolist()))
        default = -1 if self.fixed is None else self.fixed  # -1: the budget chooses
        own = np.array([default if f is None else f for f in (fixed or [None] * n)], dtype=int).reshape(-1)
        out = np.where(own >= 0, np.minimum(avail, own), 0)
        if (own >= 0).all():
            return _ints(out)
        if prefilling:
            self.chosen.append(int(out.sum()))
            return _ints(out)
        self._steps += 1
        slot = self._slot
        g = self._gains(np.fromiter((slot.get(k, 0) for k in keys), dtype=int, count=n), buckets)  # [rows, max_len]
        depth = np.arange(self.max_len)[None, :]
        fixed_gain = float(g[depth < out[:, None]].sum())  # what the fixed rows' drafts are expected to add
        avail = np.where(own >= 0, 0, avail)  # the budget chooses for the other rows
        g[depth >= avail[:, None]] = -1.0  # beyond what the drafter has
        order = np.argsort(-g, axis=None, kind="stable")
        flat = g.reshape(-1)[order]
        usable = int(np.count_nonzero(flat >= 0))
        expected = fixed_gain + np.concatenate([[0.0], np.cumsum(flat[:usable])])
        rate = self.rates(n, expected, int(out.sum()))
        best = int(np.argmax(rate))
        self._switch(best, float(rate[best] / rate[0]))
        if self.on:
            np.add.at(out, order[:best] // self.max_len, 1)
        elif self._off_steps % PROBE_EVERY == 0:
            out += self._probe(keys, avail)
        self._last_on = self.on
        self.chosen.append(int(out.sum()))
        return _ints(out)

    def _switch(self, best: int, gain: float) -> None:
        """Hysteresis: drafting switches off after OFF_AFTER steps whose best is 0, and back on after
        ON_AFTER steps that each beat not drafting by ON_MARGIN."""
        against = best == 0 if self.on else gain >= 1 + ON_MARGIN
        self._streak = self._streak + 1 if against else 0
        if self._streak >= (OFF_AFTER if self.on else ON_AFTER):
            self.on, self._streak, self._off_steps = not self.on, 0, 0
        if not self.on:
            self._off_steps += 1

    def _probe(self, keys: Sequence[Hashable], avail: npt.NDArray[np.int_]) -> npt.NDArray[np.int_]:
        """PROBE_LEN drafts on the PROBE_ROWS rows (with drafts to give) probed longest ago."""
        out = np.zeros(len(keys), dtype=int)
        cand = [i for i in np.flatnonzero(avail > 0)]
        cand.sort(key=lambda i: self._probed.get(keys[i], -1))
        for i in cand[:PROBE_ROWS]:
            out[i] = min(int(avail[i]), PROBE_LEN)
            self._probed[keys[i]] = self._steps
        return out


def _ints(values: npt.NDArray[np.int_]) -> list[int]:
    return [int(v) for v in values]
