"""Draft distillation loss: zero for a draft equal to the target, lowered by one optimisation step."""

from __future__ import annotations

import copy

import pytest
import torch

import laser
from laser.decoders.draft_model.distill import distill_loss, distill_loss_terms, hidden_projection


def test_a_copy_of_the_target_has_zero_loss(tiny_lm):
    draft = copy.deepcopy(tiny_lm.model)
    proj = hidden_projection(draft, tiny_lm.model)
    with torch.no_grad():
        proj.weight.copy_(torch.eye(proj.weight.shape[0]))
        proj.bias.zero_()
    ids = torch.randint(2, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float(distill_loss(draft, tiny_lm.model, proj, ids)) == pytest.approx(0.0, abs=1e-5)


def test_one_step_lowers_the_loss_and_leaves_the_target_alone(tiny_lm):
    draft = laser.tiny_llama(hidden_size=32, layers=1, seed=9, logit_scale=1.0).model.train()
    proj = hidden_projection(draft, tiny_lm.model)
    target_before = [p.clone() for p in tiny_lm.model.parameters()]
    ids = torch.randint(2, 96, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # a padded row
    opt = torch.optim.Adam([*draft.parameters(), *proj.parameters()], lr=1e-2)
    before = distill_loss(draft, tiny_lm.model, proj, ids, mask)
    before.backward()
    opt.step()
    with torch.no_grad():
        after = distill_loss(draft, tiny_lm.model, proj, ids, mask)
    assert float(after) < float(before)
    assert all(torch.equal(a, b) for a, b in zip(target_before, tiny_lm.model.parameters()))


def test_kl_weight_and_vocabulary_check():
    h, logits_q, logits_p = torch.zeros(1, 2, 4), torch.tensor([[[2.0, 0.0], [0.0, 0.0]]]), torch.zeros(1, 2, 2)
    ident = torch.nn.Identity()
    q = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    kl = float((q * (q.log() - torch.log(torch.tensor([0.5, 0.5])))).sum()) / 2  # second position: KL 0
    assert float(distill_loss_terms(h, h, logits_q, logits_p, ident, kl_weight=1.0)) == pytest.approx(kl, rel=1e-5)
    assert float(distill_loss_terms(h, h, logits_q, logits_p, ident)) == pytest.approx(0.1 * kl, rel=1e-5)
    with pytest.raises(ValueError, match="share a vocabulary"):
        distill_loss_terms(h, h, logits_q, torch.zeros(1, 2, 3), ident)
