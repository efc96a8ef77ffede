"""Verification rules on hand-built logits."""

from __future__ import annotations

import math

import pytest
import torch

from laser import DraftTree, TopKVerifier
from laser.tree import pack_trees
from laser.verify import select_paths

V = 8


def logits_rows(*probs_per_row: dict[int, float]) -> torch.Tensor:
    """[1, N, V] logits whose softmax puts the given probabilities on tokens (the rest shared equally)."""
    rows = []
    for probs in probs_per_row:
        rest = (1 - sum(probs.values())) / max(1, V - len(probs))
        rows.append([math.log(probs.get(t, rest)) for t in range(V)])
    return torch.tensor([rows])


def verdict(tree: DraftTree, logits: torch.Tensor, verifier: TopKVerifier):
    batch = pack_trees([tree], [0], 0, torch.float32, "cpu")
    ok = verifier.accept_nodes(logits, batch)
    return ok[0].tolist(), select_paths(logits, batch, ok)


def test_relaxed_rule_cases():
    # Chain root -> 3 -> 4 -> 5. Row 0 (after root): 2 is argmax (0.5), 3 second (0.3) -> 3 accepted.
    # Row 1: argmax 6 (0.6), 4 second with 0.05 < p -> rejected: acceptance stops there.
    tree = DraftTree.chain(0, [3, 4, 5])
    logits = logits_rows({2: 0.5, 3: 0.3}, {6: 0.6, 4: 0.05}, {5: 0.9}, {1: 0.9})
    ok, v = verdict(tree, logits, TopKVerifier(k=2, p=0.1))
    assert ok == [True, True, False, True]
    assert v[0].path == [0, 1] and v[0].tokens == [3, 6]  # correction = argmax at the path's end


def test_token_above_p_but_outside_top_k_is_rejected():
    tree = DraftTree.chain(0, [4])
    logits = logits_rows({1: 0.4, 2: 0.3, 4: 0.2}, {5: 0.9})  # 4 is third, with p = 0.2 > 0.1
    assert verdict(tree, logits, TopKVerifier(k=2, p=0.1))[0] == [True, False]
    assert verdict(tree, logits, TopKVerifier(k=3, p=0.1))[0] == [True, True]


def test_argmax_always_accepted_even_below_p():
    tree = DraftTree.chain(0, [3])
    flat = {t: 1 / V for t in range(V)}
    flat[3] += 1e-3
    flat[0] -= 1e-3
    ok, _ = verdict(tree, logits_rows(flat, {5: 0.9}), TopKVerifier(k=2, p=0.5))
    assert ok == [True, True]


def test_greedy_accepts_only_argmax_and_longest_path_wins_ties_to_dfs_order():
    # root -> a(1) -> b(2); root -> c(1) -> d(3). Row 0 argmax 1, rows of both depth-1 nodes argmax 2/3.
    tree = DraftTree([0, 1, 2, 1, 3], [-1, 0, 1, 0, 3])
    logits = logits_rows({1: 0.9}, {2: 0.9}, {7: 0.9}, {3: 0.9}, {6: 0.9})
    ok, v = verdict(tree, logits, TopKVerifier(k=1))
    assert ok == [True, True, True, True, True]
    assert v[0].path == [0, 1, 2] and v[0].tokens == [1, 2, 7]  # both paths have length 2: DFS order wins


def test_rejected_parent_blocks_children():
    tree = DraftTree([0, 5, 2, 6], [-1, 0, 1, 0])
    logits = logits_rows({6: 0.9}, {2: 0.9}, {4: 0.9}, {4: 0.9})
    ok, v = verdict(tree, logits, TopKVerifier(k=1))
    assert ok == [True, False, True, True]  # node 2 is acceptable alone, but its parent is rejected
    assert v[0].path == [0, 3] and v[0].tokens == [6, 4]


@pytest.mark.parametrize("k, p", [(0, 0.1), (2, 1.0), (2, -0.1)])
def test_bad_verifier_settings(k, p):
    with pytest.raises(ValueError):
        TopKVerifier(k=k, p=p)


def test_an_exact_row_keeps_the_greedy_rule_beside_relaxed_rows():
    # Both rows draft 3, second at row 0 (0.3 > p): the relaxed row accepts it, the exact row does not.
    tree = DraftTree.chain(0, [3])
    logits = torch.cat([logits_rows({2: 0.5, 3: 0.3}, {5: 0.9})] * 2)
    batch = pack_trees([tree, tree], [0, 0], 0, torch.float32, "cpu")
    ok = TopKVerifier(k=2, p=0.1).accept_nodes(logits, batch, exact=torch.tensor([False, True]))
    assert ok.tolist() == [[True, True], [True, False]]
