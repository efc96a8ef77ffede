"""TopK-ImpSpecDec verification: the draft's top-K candidates re-weighted by importance p/q.

At each draft position i of a chain (target distribution p_i, draft distribution q_i, drafted token x_i):

1. candidates T_K = top-K of q_i; weights w = p_i / q_i on T_K, renormalised to sum 1 (the proposal r_i);
2. y_i ~ w;
3. ``paper`` mode: accept y_i with probability min(1, p_i(y_i) / q_i(y_i)); on rejection sample the
   correction from norm(max(0, p_i - q_i)) (the paper's rule; NOT lossless, see the worked example in
   the tests). ``lossless`` mode: test against the proposal actually used, min(1, p_i(y_i) / r_i(y_i)),
   with residual norm(max(0, p_i - r_i)): exact speculative sampling with proposal r_i.
4. An accepted y_i equal to x_i continues down the chain (the target's next row was computed after x_i);
   an accepted y_i != x_i ends the step as its last token (later rows are conditioned on x_i, not y_i).
   When every draft is accepted the bonus token is drawn from the target's last row.

Each step emits accepted + 1 tokens. Degenerate cases: when p puts no mass on T_K the position is
rejected; an empty residual falls back to p. Greedy requests (temperature 0) take the greedy rule
(lossless), as :class:`laser.verify.RejectionSampler` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence

import torch

from laser.sampling import sample, target_probs
from laser.tree import DraftTree, TreeBatch
from laser.verify import Outcome, TopKVerifier, Verifier

if TYPE_CHECKING:
    from laser.request import Request

Mode = Literal["paper", "lossless"]


def importance_proposal(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates (the top-``k`` of ``q``) and their importance weights p/q renormalised to sum 1.

    Weights are all zero when ``p`` puts no mass on the candidates."""
    idx = q.topk(min(k, q.shape[-1])).indices
    qk = q[idx]
    w = torch.where(qk > 0, p[idx] / qk.clamp(min=torch.finfo(q.dtype).tiny), torch.zeros_like(qk))
    total = w.sum()
    return idx, (w / total if total > 0 else w)


class TopKImportanceVerifier(Verifier):
    """Verifies draft-model chains (``DraftTree.draft_dists`` required) by TopK-ImpSpecDec."""

    def __init__(self, k: int, mode: Mode = "lossless"):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"K (candidates per position) must be an integer >= 1, got {k!r}")
        if mode not in ("paper", "lossless"):
            raise ValueError(f"mode must be 'paper' or 'lossless', got {mode!r}")
        self.k, self.mode = k, mode
        self._greedy = TopKVerifier(1)
        # the paper's acceptance rate counts every position whose test passed, an accepted y != x included
        # (it then ends the step); the engine's accepted tokens count only drafts that continue the chain
        self.tested = self.passed = 0

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence["Request"]) -> list[Outcome]:
        greedy = self._greedy.verify(logits, batch) if any(r.sampling.greedy for r in requests) else None
        out = []
        for b, (tree, req) in enumerate(zip(batch.trees, requests)):
            if greedy is not None and req.sampling.greedy:  # greedy is None only when no row is greedy
                out.append(greedy[b])
            else:
                out.append(self.verify_chain(tree, target_probs(logits[b, : len(tree)], req.sampling), req.generator))
        return out

    def verify_chain(self, tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Outcome:
        """Walk the chain from the root; ``probs[j]`` is the target's distribution after node j."""
        if len(tree) == 1:  # nothing drafted: the target's own token
            return Outcome([0], [sample(probs[0], generator)])
        dists = tree.draft_dists
        if not tree.is_chain or dists is None:
            raise ValueError("TopK-ImpSpecDec verifies chains with draft distributions (a draft model's drafts)")
        path = [0]
        for j in range(len(tree) - 1):
            p, q = probs[j], dists[j].to(probs.device, torch.float32)
            token, keep_going = self._position(p, q, int(tree.tokens[j + 1]), generator)
            if not keep_going:
                return Outcome(path, [int(t) for t in tree.tokens[path[1:]]] + [token])
            path.append(j + 1)
        return Outcome(path, [int(t) for t in tree.tokens[path[1:]]] + [sample(probs[len(tree) - 1], generator)])

    def _position(self, p: torch.Tensor, q: torch.Tensor, drafted: int, generator: torch.Generator) -> tuple[int, bool]:
        """One position: ``(token, continue)``; continue only when the accepted token is the drafted one."""
        idx, w = importance_proposal(p, q, self.k)
        r = torch.zeros_like(p).index_copy_(0, idx, w)  # the proposal actually used, over the vocabulary
        base = q if self.mode == "paper" else r
        self.tested += 1
        if w.sum() > 0:
            y = int(idx[sample(w, generator)])
            if float(torch.rand((), generator=generator)) * base[y] < p[y]:  # u < p(y) / base(y)
                self.passed += 1
                return y, y == drafted
        residual = torch.clamp(p - base, min=0.0)
        return sample(residual if residual.sum() > 0 else p, generator), False
