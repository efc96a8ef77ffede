"""AtSpeed-S / AtSpeed-R draft alignment losses on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from laser.decoders.beam.align import align_relaxed_loss, align_strict_loss, alignment_objective


def logits(*rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_hand_computed_values():
    # V = 4, token 3 invalid; draft top-2 valid = {0, 1}: q' = (0.6, 0.4), p' = (0.25, 0.75)
    q = logits([0.3, 0.2, 0.1, 0.4])
    p = logits([0.1, 0.3, 0.5, 0.1])
    valid = torch.tensor([[True, True, True, False]])
    strict = align_strict_loss(q, p, valid, K=2)
    # p_K = 0.25: 0.6 * (log .25 - log .25) + 0.4 * (log .25 - log .75)
    assert float(strict) == pytest.approx(0.4 * math.log(0.25 / 0.75), abs=1e-6)
    assert float(align_relaxed_loss(q, p, valid, K=2)) == pytest.approx(0.35, abs=1e-6)


def test_equal_distributions_and_gradients():
    torch.manual_seed(0)
    p = torch.randn(5, 12)
    valid = torch.rand(5, 12) > 0.3
    valid[:, 0] = True
    assert float(align_relaxed_loss(p.clone(), p, valid, K=3)) == pytest.approx(0.0, abs=1e-6)
    draft = torch.randn(5, 12, requires_grad=True)
    target = torch.randn(5, 12, requires_grad=True)
    for mode in ("strict", "relaxed"):
        loss = alignment_objective(draft, target, valid, torch.zeros(5, dtype=torch.long), K=3, mode=mode)
        loss.backward()
    assert draft.grad is not None and draft.grad.abs().sum() > 0 and target.grad is None  # the target is frozen


def test_training_lowers_the_tvd():
    torch.manual_seed(1)
    target = torch.randn(4, 10)
    valid = torch.ones(4, 10, dtype=torch.bool)
    draft = torch.randn(4, 10, requires_grad=True)
    opt = torch.optim.Adam([draft], lr=0.1)
    start = float(align_relaxed_loss(draft.detach(), target, valid, K=4))
    for _ in range(100):
        opt.zero_grad()
        align_relaxed_loss(draft, target, valid, K=4).backward()
        opt.step()
    assert float(align_relaxed_loss(draft.detach(), target, valid, K=4)) < 0.2 * start


def test_bad_input():
    with pytest.raises(ValueError, match="shapes differ"):
        align_strict_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="at least one valid token"):
        align_strict_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="mode"):
        alignment_objective(
            torch.zeros(1, 3),
            torch.zeros(1, 3),
            torch.ones(1, 3, dtype=torch.bool),
            torch.zeros(1, dtype=torch.long),
            2,
            mode="x",
        )


def test_cross_entropy_on_separate_positions():
    torch.manual_seed(1)
    d, t = torch.randn(3, 8), torch.randn(3, 8)
    valid = torch.ones(3, 8, dtype=torch.bool)
    rec = torch.randn(2, 8)
    labels = torch.tensor([4, 6])
    got = alignment_objective(d, t, valid, labels, K=3, alpha=0.25, rec_logits=rec)
    want = 0.25 * align_strict_loss(d, t, valid, 3) + 0.75 * torch.nn.functional.cross_entropy(rec, labels)
    assert float(got) == pytest.approx(float(want), abs=1e-6)


def test_candidate_set_is_per_position():
    """A forced position (one valid token) beside a branching one: the branching position keeps its own
    top-K, so the losses are those of that position alone, averaged over both (the forced one adds 0)."""
    q = logits([0.3, 0.2, 0.1, 0.4], [0.1, 0.1, 0.1, 0.7])
    p = logits([0.1, 0.3, 0.5, 0.1], [0.2, 0.2, 0.2, 0.4])
    valid = torch.tensor([[True, True, True, False], [False, False, False, True]])
    assert float(align_relaxed_loss(q, p, valid, K=2)) == pytest.approx(0.35 / 2, abs=1e-6)
    assert float(align_strict_loss(q, p, valid, K=2)) == pytest.approx(0.4 * math.log(0.25 / 0.75) / 2, abs=1e-6)
