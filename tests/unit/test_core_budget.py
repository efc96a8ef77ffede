"""The adaptive draft budget: it follows the cost model and the measured acceptance, and turns
speculation off when the forward is compute-bound."""

from __future__ import annotations

import numpy as np
import pytest

from laser.budget import AdaptiveBudget
from laser.cost import ForwardCost, forward_cost
from laser.drafting import NoDrafter
from laser.request import Request
from laser.tree import DraftTree
from laser.verify import Outcome

ROWS, NODES = [1, 4, 16, 64], [1, 2, 4, 8, 16, 32, 64]


def cost(per_token: float, floor: float, additive: bool = False) -> ForwardCost:
    """A forward that costs ``floor`` seconds until its tokens cost more (max), or both (``additive``)."""
    table = [[(floor + b * n * per_token) if additive else max(floor, b * n * per_token) for n in NODES] for b in ROWS]
    return ForwardCost(key="toy", rows=ROWS, nodes=NODES, seconds=table)


def learn(policy: AdaptiveBudget, reqs: list[Request], accept_rate: float, steps: int = 30, depth: int = 12) -> None:
    """Feed chains of ``depth`` drafts, each depth accepted with ``accept_rate`` given the previous one."""
    rng = np.random.default_rng(0)
    for _ in range(steps):
        for r in reqs:
            r.budget = 64
        trees = [DraftTree.chain(1, [2] * depth) for _ in reqs]
        accepted = [int(np.argmin(rng.random(depth) < accept_rate)) if accept_rate < 1 else depth for _ in reqs]
        outcomes = [Outcome(list(range(a + 1)), [2] * (a + 1), False) for a in accepted]
        policy.observe(reqs, trees, outcomes, step_s=0.01, forward_s=0.01)


def requests(n: int) -> list[Request]:
    return [Request(tokens=[1, 2], prompt_len=2, drafter=NoDrafter(), max_new_tokens=8) for _ in range(n)]


def test_cost_model_interpolates_and_extrapolates_in_proportion():
    c = cost(per_token=0.001, floor=0.02)
    assert c.time(1, 1) == pytest.approx(0.02)
    assert c.time(16, 64) == pytest.approx(1.024)
    assert c.time(64, 128) == pytest.approx(2 * c.time(64, 64))  # beyond the grid: proportional to tokens
    assert c.time(1, 3) == pytest.approx(0.02)  # between grid points on the flat part
    # beyond the measured rows: the widest rows' cost for as many tokens, not the same curve scaled
    table = ForwardCost("t", rows=[1, 2], nodes=[1, 2, 4], seconds=[[1.0, 1.0, 2.0], [1.0, 1.5, 3.0]])
    assert table.time(4, 1) == pytest.approx(table.time(2, 2)) == pytest.approx(1.5)
    assert table.time(4, 2) == pytest.approx(3.0) and table.time(4, 4) == pytest.approx(6.0)


@pytest.mark.parametrize("rows", [1, 4, 64])
def test_budget_turns_speculation_off_when_compute_bound_and_on_when_idle(rows):
    reqs = requests(rows)
    bound = AdaptiveBudget(cost(per_token=0.001, floor=0.0))  # every token costs: no idle compute
    learn(bound, reqs, accept_rate=0.6)
    bound.assign(reqs)
    assert all(r.budget == 0 for r in reqs)

    idle = AdaptiveBudget(cost(per_token=0.00001, floor=0.05))  # flat up to 5000 tokens: idle compute
    learn(idle, reqs, accept_rate=0.9)
    idle.assign(reqs)
    assert reqs[0].budget >= 8


def test_budget_grows_with_acceptance_and_shrinks_with_load():
    c = cost(per_token=0.0005, floor=0.03, additive=True)  # every token costs a little
    chosen = {}
    for rate in (0.3, 0.9):
        for rows in (1, 16):
            policy, reqs = AdaptiveBudget(c), requests(rows)
            learn(policy, reqs, accept_rate=rate)
            policy.assign(reqs)
            chosen[rate, rows] = reqs[0].budget
    assert chosen[0.9, 1] > chosen[0.3, 1]
    assert chosen[0.9, 1] > chosen[0.9, 16]


def test_rows_without_drafts_expect_nothing():
    policy, reqs = AdaptiveBudget(cost(per_token=0.0001, floor=0.05)), requests(2)
    for _ in range(20):
        for r in reqs:
            r.budget = 8
        policy.observe(
            reqs,
            [DraftTree.chain(1, [2, 2, 2]), DraftTree.chain(1)],
            [Outcome([0, 1, 2, 3], [2] * 4, False), Outcome([0], [2], False)],
            0.01,
            0.01,
        )
    assert policy.expected(reqs[0], 8) > 2.0
    assert policy.expected(reqs[1], 8) < 0.3


def test_forward_cost_is_measured_once_and_cached(tiny_lm, tmp_path):
    a = forward_cost(tiny_lm.model, cache_dir=tmp_path, rows=(1, 4), nodes=(1, 8))
    assert len(list(tmp_path.glob("*.json"))) == 1 and set(a.measured) == {"1x1", "1x8", "4x1", "4x8"}
    assert all(t > 0 for row in a.seconds for t in row)
    b = forward_cost(tiny_lm.model, cache_dir=tmp_path, rows=(1, 4), nodes=(1, 8))
    assert b.seconds == a.seconds  # read back, not measured again


def test_speculation_off_still_probes_now_and_then():
    from laser.budget import PROBE_BUDGET, PROBE_EVERY

    reqs = requests(64)
    policy = AdaptiveBudget(cost(per_token=0.001, floor=0.0))
    learn(policy, reqs, accept_rate=0.2)
    for _ in range(2 * PROBE_EVERY):
        policy.assign(reqs)
    assert policy.chosen[-2 * PROBE_EVERY :].count(PROBE_BUDGET) == 2  # one probe per PROBE_EVERY steps
    assert policy.chosen[-2 * PROBE_EVERY :].count(0) == 2 * PROBE_EVERY - 2
