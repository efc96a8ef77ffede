"""The draft-length policy of LASER inside vLLM (laser.vllm.budget) and the relaxed rule's arithmetic:
plain numpy/torch, no vLLM needed."""
from __future__ import annotations

import torch

from laser.cost import ForwardCost
from laser.vllm.budget import PROBE_EVERY, ChainBudget
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


def test_drafting_off_still_probes_now_and_then():
    dear = ChainBudget(cost=_cost(1.0), max_len=8)
    got = [dear.lengths(["a"], [8]) for _ in range(PROBE_EVERY)]
    assert got[:-1] == [[0]] * (PROBE_EVERY - 1) and got[-1][0] > 0


def test_rows_that_keep_rejecting_get_shorter_drafts():
    b = ChainBudget(cost=_cost(0.05), max_len=8)
    for _ in range(40):
        b.observe("bad", 8, 0)
        b.observe("good", 8, 8)
    bad, good = b.lengths(["bad", "good"], [8, 8])
    assert bad < good


def test_relaxed_rule_toy_distribution():
    probs = torch.tensor([[.6, .3, .05, .05], [.5, .45, .03, .02]])
    acc = relaxed_accept(probs.log(), torch.tensor([1, 2]), torch.tensor([2, 2]), torch.tensor([.1, .1]))
    assert acc.tolist() == [True, False]  # 1: top-2 and .3 > .1; 2: not in the top-2
    out = chain_output(acc, torch.tensor([1, 2]), probs.argmax(-1), torch.tensor([3]), [2], 4)
    assert out[0].tolist() == [1, 0, -1, -1]  # accepted draft, then the argmax where the chain broke

