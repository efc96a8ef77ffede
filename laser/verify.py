"""Vectorised verification of a batch of draft trees against the target's logits.

Definitions (per node i with parent j, under the target distribution q_j at j's row):

- greedy:  accept draft token x_i iff x_i == argmax q_j            (lossless, k = 1)
- relaxed: accept x_i iff x_i == argmax q_j, or (x_i in TopK(q_j, k) and q_j(x_i) > p)   (LASER, Eq. 8)

A node's path is accepted when every node from the root to it is accepted (the root always is); the
longest accepted path wins, ties going to the first in depth-first order. The token after the path is
the argmax at the path's last node: a *correction* when a draft child was rejected there, a *bonus*
when the path ran to a leaf.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from laser.tree import TreeBatch


@dataclass(frozen=True)
class TopKVerifier:
    """Greedy (``k=1``) or relaxed (``k>1``, threshold ``p``) verification."""

    k: int = 1
    p: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"verification k must be an integer >= 1, got {self.k!r}")
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"verification p must lie in [0, 1), got {self.p!r}")

    def accept_nodes(self, logits: torch.Tensor, batch: TreeBatch) -> torch.Tensor:
        """``[B, N]`` bool: is each node's own token acceptable at its parent's row (root: True)."""
        # logits [B, N, V]. Row statistics once per tree row, then read at each node's parent row.
        rows = batch.parents.clamp(min=0)  # [B, N] root and padding read row 0, masked below
        at_parent = lambda t: t.gather(1, rows)  # noqa: E731  [B, N] row stat -> node
        b_idx = torch.arange(logits.shape[0], device=logits.device)[:, None]
        draft_logit = logits[b_idx, rows, batch.tokens.clamp(min=0)]  # [B, N]
        ok = batch.tokens == at_parent(logits.argmax(-1))
        if self.k > 1:
            kth = logits.topk(self.k, dim=-1).values[..., -1]  # [B, N]
            log_prob = draft_logit.float() - at_parent(torch.logsumexp(logits.float(), dim=-1))
            ok |= (draft_logit >= at_parent(kth)) & (log_prob.exp() > self.p)
        return (ok | (batch.parents < 0)) & batch.node_valid


@dataclass
class Verdict:
    """Per sequence: accepted node indices (root first) and the next token after them."""

    path: list[list[int]]
    next_token: list[int]


def select_paths(logits: torch.Tensor, batch: TreeBatch, node_ok: torch.Tensor) -> Verdict:
    """Longest fully accepted root-to-node path per tree, then the argmax after it."""
    # A node is reachable when no ancestor-or-self is rejected.
    reachable = ~(batch.ancestors & ~node_ok[:, None, :]).any(-1)  # [B, N]
    score = torch.where(reachable, batch.depth, torch.full_like(batch.depth, -1))
    best = score.argmax(dim=1)  # first maximum = DFS order tie-break; [B]
    on_path = batch.ancestors[torch.arange(len(best)), best]  # [B, N]
    next_token = logits[torch.arange(len(best)), best].argmax(-1)  # [B]
    paths = [row.nonzero().flatten().tolist() for row in on_path.cpu()]
    return Verdict(path=paths, next_token=next_token.tolist())
