"""AtSpeed draft alignment losses (the draft learns to rank the target's top-K like the target does).

All take per-position logits ``[T, V]`` of the draft and the (frozen) target at the item identifier's
positions, and ``valid [T, V]``: the tokens the item trie allows there. ``V_c`` is the draft's top-K
valid tokens at each position; p and q are renormalised over it (as the authors' code does).

- :func:`align_strict_loss` (AtSpeed-S, for strict verification): mean over positions of
  RKLD_t - DR_t = sum_{v in V_c} q(v) [log p(y_K) - log p(v)], with p(y_K) the target's K-th largest
  probability on V_c (the paper's RKLD minus its DR term; the q log q parts cancel).
- :func:`align_relaxed_loss` (AtSpeed-R, for relaxed verification): mean TVD(p, q) on V_c (the paper's
  -sum log TVD is a typo: minimise the TVD).
- :func:`alignment_objective`: alpha * L_align + (1 - alpha) * L_rec, L_rec the draft's next-token
  cross-entropy on the ground-truth identifier.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _on_candidates(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor, K: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log q, log p) renormalised over each position's draft top-K valid tokens, and that set's mask."""
    if draft_logits.shape != target_logits.shape or valid.shape != draft_logits.shape:
        raise ValueError(
            f"shapes differ: draft {tuple(draft_logits.shape)}, target {tuple(target_logits.shape)}, "
            f"valid {tuple(valid.shape)}"
        )
    if not valid.any(-1).all():
        raise ValueError("every position needs at least one valid token")
    neg = torch.finfo(draft_logits.dtype).min
    masked = draft_logits.masked_fill(~valid, neg)
    # per position: the draft's top-K valid tokens, or all valid ones where fewer (invalid picks dropped)
    top = masked.topk(min(K, valid.shape[-1]), dim=-1).indices
    cand = torch.zeros_like(valid).scatter_(-1, top, True) & valid
    log_q = torch.log_softmax(draft_logits.masked_fill(~cand, neg), -1)
    log_p = torch.log_softmax(target_logits.detach().float().masked_fill(~cand, torch.finfo(torch.float32).min), -1)
    return log_q, log_p, cand


def align_strict_loss(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor, K: int
) -> torch.Tensor:
    log_q, log_p, cand = _on_candidates(draft_logits, target_logits, valid, K)
    log_pk = log_p.masked_fill(~cand, float("inf")).min(-1, keepdim=True).values  # K-th best on V_c
    q = log_q.exp() * cand
    return (q * (log_pk - log_p).masked_fill(~cand, 0.0)).sum(-1).mean()


def align_relaxed_loss(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor, K: int
) -> torch.Tensor:
    log_q, log_p, cand = _on_candidates(draft_logits, target_logits, valid, K)
    return 0.5 * ((log_q.exp() - log_p.exp()) * cand).abs().sum(-1).mean()


def alignment_objective(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    valid: torch.Tensor,
    labels: torch.Tensor,
    K: int,
    alpha: float = 0.5,
    mode: str = "strict",
    rec_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha * alignment (``mode`` strict: AtSpeed-S, relaxed: AtSpeed-R) + (1 - alpha) * cross-entropy.

    The cross-entropy is on ``rec_logits`` (the draft's logits at other positions, e.g. the ground-truth
    item's, while the alignment runs on generated sequences) when given, else on ``draft_logits``;
    ``labels`` name the tokens of those positions.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    loss = {"strict": align_strict_loss, "relaxed": align_relaxed_loss}.get(mode)
    if loss is None:
        raise ValueError(f"mode must be 'strict' or 'relaxed', got {mode!r}")
    rec = F.cross_entropy((draft_logits if rec_logits is None else rec_logits).float(), labels)
    return alpha * loss(draft_logits, target_logits, valid, K) + (1 - alpha) * rec
