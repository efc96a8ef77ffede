"""Draft distillation loss of TopK-ImpSpecDec (EAGLE-style): L = L_reg + 0.1 * L_cls, where

- L_reg = Smooth-L1 between the draft's last hidden states, projected to the target's width by a learned
  linear map, and the target's last hidden states (same positions);
- L_cls = KL(draft || target) of the next-token distributions, averaged over positions.

The target is frozen (no gradient); the draft and the projection are trained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def hidden_projection(draft: PreTrainedModel, target: PreTrainedModel) -> torch.nn.Linear:
    """The learned map from the draft's hidden width up to the target's."""
    return torch.nn.Linear(draft.config.hidden_size, target.config.hidden_size).to(next(draft.parameters()).device)


def distill_loss_terms(
    draft_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    proj: torch.nn.Module,
    mask: torch.Tensor | None = None,
    kl_weight: float = 0.1,
) -> torch.Tensor:
    """The loss from both models' outputs: hidden ``[B, T, H_d]`` / ``[B, T, H_t]``, logits ``[B, T, V]``,
    ``mask`` ``[B, T]`` (1 = a real position; None = all)."""
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"draft logits {tuple(draft_logits.shape)} and target logits "
            f"{tuple(target_logits.shape)} differ: the models must share a vocabulary"
        )
    mask = torch.ones(draft_logits.shape[:2], device=draft_logits.device) if mask is None else mask.float()
    reg = F.smooth_l1_loss(proj(draft_hidden).float(), target_hidden.float(), reduction="none").mean(-1)
    log_q = torch.log_softmax(draft_logits.float(), -1)
    log_p = torch.log_softmax(target_logits.float(), -1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)  # KL(draft || target) per position
    per_position = reg + kl_weight * kl
    return (per_position * mask).sum() / mask.sum().clamp(min=1.0)


def distill_loss(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    proj: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    kl_weight: float = 0.1,
) -> torch.Tensor:
    """Run both models on ``input_ids`` ``[B, T]`` and return the distillation loss (target frozen)."""
    with torch.no_grad():
        t = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    d = draft(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return distill_loss_terms(
        d.hidden_states[-1], t.hidden_states[-1], d.logits, t.logits, proj, attention_mask, kl_weight
    )
