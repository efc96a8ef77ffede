"""TopK-ImpSpecDec verification by hand: importance weights, K = 1, tokens per step, and the notes' worked
V = 3 example (p = (0.2, 0.3, 0.5), q = (0.5, 0.3, 0.2), K = 2): paper mode outputs (0.114, 0.714, 0.171),
the lossless mode outputs p.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from laser.tree import DraftTree
from laser.decoders.draft_model.topk_imp import TopKImportanceVerifier, importance_proposal

P = torch.tensor([0.2, 0.3, 0.5])
Q = torch.tensor([0.5, 0.3, 0.2])
PAPER_OUTPUT = np.array([0.8 / 7, 5 / 7, 1.2 / 7])  # (2/7)(0.4), 5/7, (2/7)(0.6): derived in the notes
N = 6000


def test_importance_weights_sum_to_one_over_the_top_k():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        p, q = torch.rand(10, generator=gen).softmax(0), torch.rand(10, generator=gen).softmax(0)
        idx, w = importance_proposal(p, q, 4)
        assert set(idx.tolist()) == set(q.topk(4).indices.tolist())
        assert float(w.sum()) == pytest.approx(1.0) and (w >= 0).all()
        assert torch.allclose(w, (p[idx] / q[idx]) / (p[idx] / q[idx]).sum())
    idx, w = importance_proposal(torch.tensor([0.0, 0.0, 1.0]), Q, 2)  # p has no mass on T_K: no proposal
    assert w.sum() == 0


def test_k_1_proposes_the_draft_argmax():
    idx, w = importance_proposal(P, Q, 1)
    assert idx.tolist() == [0] and w.tolist() == [1.0]
    gen = torch.Generator().manual_seed(1)
    verifier = TopKImportanceVerifier(1, "paper")
    tree = DraftTree.chain(9, [0], draft_dists=Q[None])
    p_more = torch.stack([torch.tensor([0.6, 0.2, 0.2]), P])  # p(argmax q) >= q(argmax q): always accepted
    for _ in range(50):
        out = verifier.verify_chain(tree, p_more, gen)
        assert out.path == [0, 1] and out.tokens[0] == 0


@pytest.mark.parametrize("mode", ["paper", "lossless"])
def test_tokens_per_step_are_accepted_plus_one(mode):
    gen = torch.Generator().manual_seed(2)
    verifier = TopKImportanceVerifier(3, mode)
    accepted = drafted = 0
    for _ in range(300):
        q = torch.rand(4, 6, generator=gen).softmax(-1)
        p = torch.rand(5, 6, generator=gen).softmax(-1)
        drafts = [int(torch.multinomial(row, 1, generator=gen)) for row in q]
        out = verifier.verify_chain(DraftTree.chain(0, drafts, draft_dists=q), p, gen)
        assert len(out.tokens) == len(out.path) and out.path == list(range(len(out.path)))
        assert out.tokens[:-1] == drafts[: len(out.path) - 1]
        accepted, drafted = accepted + len(out.path) - 1, drafted + 4
    assert 0.0 < accepted / drafted < 1.0


def _first_tokens(mode: str) -> np.ndarray:
    gen, verifier = torch.Generator().manual_seed(3), TopKImportanceVerifier(2, mode)
    probs = torch.stack([P, torch.tensor([1.0, 0.0, 0.0])])
    counts = np.zeros(3)
    for _ in range(N):
        x = int(torch.multinomial(Q, 1, generator=gen))
        counts[verifier.verify_chain(DraftTree.chain(0, [x], draft_dists=Q[None]), probs, gen).tokens[0]] += 1
    return counts


def test_worked_example_paper_mode():
    counts = _first_tokens("paper")
    assert chisquare(counts, PAPER_OUTPUT * N).pvalue > 1e-3
    assert chisquare(counts, P.double().numpy() * N).pvalue < 1e-3  # not the target: paper mode is lossy


def test_worked_example_lossless_mode():
    counts = _first_tokens("lossless")
    assert chisquare(counts, P.double().numpy() * N).pvalue > 1e-3
    assert chisquare(counts, PAPER_OUTPUT * N).pvalue < 1e-3


def test_needs_chains_with_draft_distributions():
    with pytest.raises(ValueError, match="chains with draft distributions"):
        TopKImportanceVerifier(2).verify_chain(DraftTree([0, 1, 2], [-1, 0, 0]), torch.eye(3), torch.Generator())
