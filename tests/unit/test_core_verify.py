"""Verification rules on hand-built logits."""

from __future__ import annotations

import math

import pytest
import torch

from laser import DraftTree, TopKVerifier
from laser.tree import pack_trees
from laser.request import Request
from laser.verify import repeats, select_paths, tree_repeats

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


def test_repeats_marks_tokens_that_complete_a_seen_ngram():
    text = [1, 2, 3, 4, 9]
    assert repeats(text, [1, 2, 3, 4], 3) == [False, False, True, True]  # "1 2 3" then "2 3 4" again
    assert repeats(text, [7, 7, 7, 7], 3) == [False, False, False, True]  # the chain's own repeat counts
    assert repeats([5], [1, 2], 4) == [False, False] and repeats(text, [1, 2, 3], 1) == [False] * 3


def test_tree_repeats_judges_each_node_on_its_own_path():
    # text ... 2 3 4 | root 3 -> 4 (repeats "3 4" + ... no) ; n=3 over generated text [2, 3, 4, 2, 3]
    text = [2, 3, 4, 2, 3]  # the root is the text's last token (3)
    tree = DraftTree([3, 4, 5, 9], [-1, 0, 1, 0])  # 3 -> 4 -> 5 and 3 -> 9
    assert tree_repeats(text, tree, 3) == [False, True, False, False]  # "2 3 4" again; "3 4 5" and "2 3 9" new
    chain = DraftTree.chain(3, [4, 2, 3])
    assert tree_repeats(text, chain, 3)[1:] == repeats(text, [4, 2, 3], 3)


def _looping_request(tokens: list[int]) -> Request:
    return Request(tokens=[7] + tokens, prompt_len=1, drafter=None, max_new_tokens=32)  # type: ignore[arg-type]


def test_relaxed_acceptance_never_extends_a_repetition():
    """A runner-up draft token that would repeat a 4-gram of the generated text is left to the greedy rule;
    the same token is accepted where it repeats nothing, and the argmax always is (greedy stays lossless).
    With the rule off (fresh_n=0) the repeat goes through: the test fails when the rule is broken."""
    loop = [1, 2, 3, 4, 1, 2, 3]  # generated so far; the root is 3, the draft 4 would repeat "1 2 3 4"
    tree = DraftTree.chain(3, [4])
    batch = pack_trees([tree], [0], 0, torch.float32, "cpu")
    runner_up = logits_rows({5: 0.5, 4: 0.3}, {6: 0.9})  # 4 is second with 0.3 > p
    argmax = logits_rows({4: 0.5, 5: 0.3}, {6: 0.9})
    relaxed = TopKVerifier(k=2, p=0.1)
    assert relaxed.verify(runner_up, batch, [_looping_request(loop)])[0].tokens == [5]
    assert relaxed.verify(runner_up, batch, [_looping_request([8, 8, 8, 8, 1, 2, 3])])[0].tokens == [4, 6]
    assert relaxed.verify(argmax, batch, [_looping_request(loop)])[0].tokens == [4, 6]
    assert TopKVerifier(k=2, p=0.1, fresh_n=0).verify(runner_up, batch, [_looping_request(loop)])[0].tokens == [4, 6]
