"""The draft-length policy of LASER inside vLLM (laser.vllm.chain_budget) and the relaxed rule's arithmetic:
plain numpy/torch, no vLLM needed."""

from __future__ import annotations

import torch

from laser.cost import ForwardCost
import numpy as np

from laser.vllm.chain_budget import OFF_AFTER, PROBE_EVERY, PROBE_ROWS, ChainBudget
from laser.vllm.relaxed import chain_output, relaxed_accept

ROWS, NODES = [1, 2, 4, 8, 16], [1, 2, 3, 5, 9]


def _cost(extra_token_share: float) -> ForwardCost:
    """A step costing 10 ms plus ``extra_token_share`` x 10 ms per token beyond one per row."""
    return ForwardCost("t", ROWS, NODES, [[0.01 * (1 + extra_token_share * r * (n - 1)) for n in NODES] for r in ROWS])


def test_fixed_length_is_capped_by_what_each_row_has():
    b = ChainBudget(cost=None, max_len=8, fixed=4)
    assert b.lengths(["a", "b", "c"], [8, 2, 0]) == [4, 2, 0]


def test_cheap_tokens_draft_long_dear_tokens_draft_nothing():
    cheap = ChainBudget(cost=_cost(0.0), max_len=8)
    assert cheap.lengths(["a", "b"], [8, 8]) == [8, 8]
    dear = ChainBudget(cost=_cost(1.0), max_len=8)
    assert dear.lengths(["a", "b"], [8, 8]) == [0, 0]


def test_where_extra_tokens_cost_more_than_they_yield_every_row_drafts_nothing():
    """Each draft token adds at most one expected token; here it costs more than one token's share of
    the step, so the best length is 0 for every row, whatever the rows' acceptance."""
    b = ChainBudget(cost=_cost(1.0), max_len=8)
    for _ in range(20):
        b.observe("sure", 8, 8)  # a row that accepts everything still must not draft
    for n in (1, 3, 16):
        keys = ["sure"] + [f"r{i}" for i in range(n - 1)]
        assert b.lengths(keys, [8] * n) == [0] * n


def test_drafting_off_probes_a_few_rows_in_turn():
    dear = ChainBudget(cost=_cost(1.0), max_len=8)
    keys = [f"r{i}" for i in range(6)]
    got = [dear.lengths(keys, [8] * 6) for _ in range(OFF_AFTER + 3 * PROBE_EVERY)]
    assert not dear.on
    probes = [g for g in got if any(g)]
    assert len(probes) == 3  # one step in PROBE_EVERY once off
    assert all(sum(1 for x in g if x) <= PROBE_ROWS for g in probes)
    probed = [i for g in probes for i, x in enumerate(g) if x]
    assert len(set(probed)) == len(probed) == 3 * PROBE_ROWS  # rotating: no row probed twice before the others


def test_switching_is_damped():
    """A cost estimate that swings every step (dear, cheap, dear, ...) does not switch drafting on and
    off every step: off needs OFF_AFTER losing steps in a row, on needs ON_AFTER winning ones."""
    b = ChainBudget(cost=_cost(0.0), max_len=8, learn=False)
    for _ in range(10):
        b.observe("a", 8, 8)

    def run(steps):
        states = []
        for step in range(steps):
            b.step_cost.per_token = 0.05 if step % 2 == 0 else 0.0  # dear, cheap, dear, ...
            b.lengths(["a"], [8])
            states.append(b.on)
        return states

    assert run(20) == [True] * 20  # on, and the dear steps never come three in a row
    b.step_cost.per_token = 0.05
    for _ in range(OFF_AFTER):
        b.lengths(["a"], [8])
    assert not b.on
    assert run(20) == [False] * 20  # off, and the cheap steps never come two in a row
    b.step_cost.per_token = 0.0
    b.lengths(["a"], [8])
    assert b.lengths(["a"], [8]) == [8] and b.on


def test_lengths_are_array_arithmetic_and_match_the_greedy_split():
    """The vectorised split gives each row the prefix of its gains among the T largest."""
    b = ChainBudget(cost=_cost(0.02), max_len=4)
    for _ in range(30):
        b.observe("hi", 4, 4)
        b.observe("mid", 4, 1)
        b.observe("lo", 4, 0)
    keys, avail = ["hi", "mid", "lo", "new"], [4, 4, 4, 2]
    got = b.lengths(keys, avail)
    g = np.stack([b.gains(k) for k in keys])
    for i, L in enumerate(got):
        assert L <= avail[i]
        if L < avail[i]:  # every token not taken is worth no more than every token taken
            taken = [g[j, d] for j, Lj in enumerate(got) for d in range(Lj)]
            assert not taken or g[i, L] <= min(taken) + 1e-12
    assert got[0] >= got[1] >= got[2]


def test_rows_that_keep_rejecting_get_shorter_drafts():
    b = ChainBudget(cost=_cost(0.05), max_len=8)
    for _ in range(40):
        b.observe("bad", 8, 0)
        b.observe("good", 8, 8)
    bad, good = b.lengths(["bad", "good"], [8, 8])
    assert bad < good


def test_relaxed_rule_toy_distribution():
    probs = torch.tensor([[0.6, 0.3, 0.05, 0.05], [0.5, 0.45, 0.03, 0.02]])
    acc, _ = relaxed_accept(probs.log(), torch.tensor([1, 2]), torch.tensor([2, 2]), torch.tensor([0.1, 0.1]))
    assert acc.tolist() == [True, False]  # 1: top-2 and .3 > .1; 2: not in the top-2
    out = chain_output(acc, torch.tensor([1, 2]), probs.argmax(-1), torch.tensor([3]), [2], 4)
    assert out[0].tolist() == [1, 0, -1, -1]  # accepted draft, then the argmax where the chain broke


def test_no_row_drafts_while_prompts_are_prefilled_in_chunks():
    """A step full of prompt chunks: drafts would displace prompt tokens, so no row drafts, not even a probe;
    the same rows draft once the prompts are in."""
    b = ChainBudget(cost=_cost(0.0), max_len=8)
    for _ in range(20):
        b.observe("r", 8, 8)
    assert b.lengths(["r", "s"], [8, 8], [4, 4], prefilling=True) == [0, 0]
    assert all(n > 0 for n in b.lengths(["r", "s"], [8, 8], [4, 4]))
    fixed = ChainBudget(cost=None, max_len=8, fixed=3)
    assert fixed.lengths(["r"], [8], [4], prefilling=True) == [3]  # a study's fixed length is kept


def test_a_row_with_its_own_fixed_length_keeps_it_beside_budgeted_rows():
    """A request that asked for a fixed length drafts it (capped by what it has, none on a zero match)
    whatever the cost, prefilling or not; the budget chooses for the others with those drafts counted."""
    dear = ChainBudget(cost=_cost(1.0), max_len=8)
    assert dear.lengths(["f", "a", "z"], [8, 8, 8], [4, 4, 0], fixed=[3, None, 5]) == [3, 0, 0]
    assert dear.lengths(["f", "a"], [2, 8], [4, 4], prefilling=True, fixed=[3, None]) == [2, 0]
    cheap = ChainBudget(cost=_cost(0.0), max_len=8)
    assert cheap.lengths(["f", "a"], [8, 8], [4, 4], fixed=[1, None]) == [1, 8]
    seen = []
    cheap.rates = lambda n, expected, fixed=0: seen.append(fixed) or 1.0 + np.arange(len(expected))
    cheap.lengths(["f", "g", "a"], [8, 8, 8], [4, 4, 4], fixed=[2, 3, None])
    assert seen == [5]  # the fixed rows' drafts are priced into every total the budget weighs
