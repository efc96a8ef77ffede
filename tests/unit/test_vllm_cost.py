"""The vLLM step-cost model: the shipped prior, its scaling, and what the budget learns from steps that ran
(laser.vllm.step_cost, laser.vllm.chain_budget; plain numpy, no vLLM needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from laser.cost import ForwardCost
from laser.vllm.chain_budget import ChainBudget
from laser.vllm.step_cost import PRIOR_FILE, StepCost, matmul_params, prior_cost

ROWS, NODES = [1, 2, 4, 8, 16], [1, 2, 3, 5, 9]


def _cost(extra_token_share: float) -> ForwardCost:
    return ForwardCost("t", ROWS, NODES, [[0.01 * (1 + extra_token_share * r * (n - 1)) for n in NODES] for r in ROWS])


def test_vectorised_times_match_the_scalar_model():
    c = ForwardCost("t", ROWS, NODES, [[0.01 * r**0.5 * n**0.7 for n in NODES] for r in ROWS])
    rows = np.array([1, 3, 16, 40, 2, 7])
    nodes = np.array([1.0, 2.5, 9, 20, 1.3, 4])
    assert np.allclose(c.times(rows, nodes), [c.time(r, n) for r, n in zip(rows, nodes)])


def _feed(b: ChainBudget, rows: int, price: float, steps: int = 30) -> None:
    """Steps of ``rows`` rows at 10 ms plus ``price`` seconds per draft token, at several draft totals."""
    for s in range(steps):
        drafts = [0, rows, 2 * rows, 4 * rows][s % 4]
        b.observe_step(rows, rows + drafts, 0.01 + price * drafts, 0.0)


def _accepting(b: ChainBudget, accepted: int) -> None:
    """Rows "a" and "b" have accepted ``accepted`` of 8 drafts, ten steps each."""
    for _ in range(10):
        b.observe("a", 8, accepted)
        b.observe("b", 8, accepted)


def test_steps_whose_cost_grows_steeply_with_tokens_turn_drafting_off():
    b = ChainBudget(cost=_cost(0.0), max_len=8)  # the table says tokens are free
    _accepting(b, 8)
    assert b.lengths(["a", "b"], [8, 8]) == [8, 8]
    _feed(b, 2, 0.01)  # each draft token costs as much as a whole step
    assert b.step_cost.per_token > 0.005
    assert b.lengths(["a", "b"], [8, 8]) == [0, 0]


def test_steps_that_cost_the_same_whatever_the_tokens_make_drafts_grow():
    b = ChainBudget(cost=_cost(1.0), max_len=8)  # the table says tokens are dear
    _accepting(b, 6)
    assert b.lengths(["a", "b"], [8, 8]) == [0, 0]
    _feed(b, 2, 0.0)  # they are free on this machine
    assert sum(b.lengths(["a", "b"], [8, 8])) > 4


def test_a_fixed_step_cost_the_table_lacks_does_not_make_drafts_dear():
    # the table: 5 ms a step, 5 ms a token; this machine: 60 ms a step, 1 ms a token (memory-bound)
    table = ForwardCost("t", ROWS, NODES, [[0.005 + 0.005 * r * n for n in NODES] for r in ROWS])
    b = ChainBudget(cost=table, max_len=8)
    _accepting(b, 4)  # half the drafts are accepted
    for s in range(60):  # plain steps of every width, as a pass's batch fills and drains
        rows = ROWS[s % len(ROWS)]
        b.observe_step(rows, rows, 0.06 + 0.001 * rows, 0.0)
    c = b.step_cost
    assert float(c.seconds(16, 0)) == pytest.approx(0.076, rel=0.1)
    assert float(c.seconds(16, 16) - c.seconds(16, 0)) == pytest.approx(0.016, rel=0.3)  # what 16 drafts cost
    assert sum(b.lengths(["a", "b"], [8, 8])) >= 8


def test_the_proposers_time_counts_against_drafting():
    b = ChainBudget(cost=_cost(0.0), max_len=8)
    for _ in range(10):
        b.observe("a", 8, 1)  # about one extra token a step from drafting
    assert b.lengths(["a"], [8])[0] > 0
    for _ in range(30):
        b.observe_step(1, 1 + 8, 0.01, 0.05)  # drafting: the proposer takes 5 steps' time
    assert b.step_cost.drafting(1, True) == pytest.approx(0.05, rel=0.05)
    for _ in range(3):
        got = b.lengths(["a"], [8])
    assert got == [0]


def test_one_stalled_step_does_not_swing_the_model():
    c = StepCost(_cost(0.1))
    for _ in range(20):
        c.observe(4, 4, float(c.seconds(4, 4)))
    before = float(c.seconds(4, 8))
    c.observe(4, 4, 50.0)
    assert float(c.seconds(4, 8)) < 2 * before


def test_prefill_steps_teach_nothing():
    b = ChainBudget(cost=_cost(0.0), max_len=8)
    b.observe_step(2, 900, 3.0, 0.0)
    assert b.step_cost.steps == 0


def test_shipped_prior_is_readable_and_scales_with_model_and_threads():
    prior = json.loads(PRIOR_FILE.read_text())
    for k in ("model", "device", "threads", "rows", "nodes", "seconds", "config", "load_average"):
        assert k in prior
    cfg = prior["config"]
    same = prior_cost(cfg, prior["threads"])
    assert np.allclose(same.seconds, prior["seconds"])
    big = {**cfg, "hidden_size": cfg["hidden_size"] * 2, "intermediate_size": cfg["intermediate_size"] * 2}
    assert matmul_params(big) > 3 * matmul_params(cfg)
    assert prior_cost(big, prior["threads"]).time(4, 2) > 3 * same.time(4, 2)
    assert prior_cost(cfg, prior["threads"] * 2).time(4, 2) < same.time(4, 2)
    # monotone in tokens per row: more tokens never cost less
    t = np.asarray(same.seconds)
    assert (np.diff(t, axis=1) > -0.2 * t[:, 1:]).all()


def test_drafts_go_where_the_drafter_matched_more():
    """Long matches are accepted, short ones are not: on the same rows, a step drafts on the rows whose
    drafter matched a long suffix and not on those that matched one token; a row that matched nothing
    gets no draft, even at a fixed length."""
    b = ChainBudget(cost=_cost(0.05), max_len=4)
    rows = [f"r{i}" for i in range(8)]
    for step in range(40):  # rows alternate between long and short matches, as text goes along
        long_rows = rows[step % 2 :: 2]
        b.lengths(rows, [4] * 8, [4 if r in long_rows else 1 for r in rows])
        for r in rows:
            b.observe(r, 4, 4 if r in long_rows else 0)
    got = b.lengths(rows, [4] * 8, [5, 1, 6, 1, 4, 1, 9, 1])
    assert all(n > 0 for n in got[0::2]) and all(n == 0 for n in got[1::2]), got
    assert b.gains("r0", 4)[0] > 0.8 > 0.2 > b.gains("r0", 1)[0]
    fixed = ChainBudget(cost=None, max_len=4, fixed=3)
    assert fixed.lengths(["a", "b", "c"], [4, 4, 2], [2, 0, None]) == [3, 0, 2]
