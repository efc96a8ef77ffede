"""AtSpeed-R relaxed sampling verification of drafted beams (approximately distribution-preserving).

The target decodes by sampling beam search at temperature 1: each step draws K distinct candidates from
the beam-level distribution p (``laser.decoders.beam.search.beam_probs``: p(c) proportional to exp(cumulative score) over
the finished beams and every allowed extension of the live ones). Per drafted step j (notes' errata
applied: the output resets each step, the test is ``>= K``, a rejected step ends the iteration):

- every drafted candidate y is accepted independently iff u <= p(y) / q(y) (p = 0 for children of
  beams the target did not accept);
- at least K accepted: keep a uniform random K of them and go on to step j + 1;
- otherwise: draw the missing K - #accepted without replacement from the residual norm(max(0, p - q))
  (accepted ones zeroed) and end the iteration.

After all drafted steps are accepted a bonus step draws K from p. A drafted candidate y ~ q is accepted
with probability 1 - TVD(p, q); with K = N = 1 one step is exactly speculative sampling.
"""

from __future__ import annotations

import numpy as np
import torch

from laser.decoders.beam.search import BeamState, Hyp, beam_outcome, beam_probs, candidates
from laser.request import Request
from laser.tree import DraftTree
from laser.verify import BeamVerifier, Outcome


def sample_distinct(probs: np.ndarray, n: int, generator: torch.Generator) -> list[int]:
    """``min(n, len(probs))`` distinct indices drawn successively from ``probs``. When fewer than ``n``
    have mass (scores far below the best underflow to 0), the rest are the lowest such indices."""
    n = min(n, len(probs))
    live = int(np.count_nonzero(probs > 0))
    out: list[int] = []
    if min(n, live) > 0:
        t = torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float64))
        out = torch.multinomial(t, min(n, live), replacement=False, generator=generator).tolist()
    if len(out) < n:
        out += np.flatnonzero(probs <= 0)[: n - len(out)].tolist()
    return out


def relaxed_accept(
    p: np.ndarray, q: np.ndarray, drafted: list[int], K: int, generator: torch.Generator, broken_residual: bool = False
) -> tuple[list[int], bool]:
    """One step's K chosen candidate indices and whether the step was accepted (see module docstring).

    ``broken_residual`` (tests only) refills from p instead of the residual, biasing towards the drafts.
    """
    u = torch.rand(len(drafted), generator=generator, dtype=torch.float64).numpy()
    accepted = [c for c, r in zip(drafted, u) if r * q[c] < p[c]]
    if len(accepted) >= K:
        keep = torch.randperm(len(accepted), generator=generator)[:K].tolist()
        return [accepted[i] for i in keep], True
    rest = p.copy() if broken_residual else np.maximum(p - q, 0.0)
    rest[accepted] = 0.0
    if rest.sum() <= 0:  # p <= q everywhere left: the residual is empty, fall back to p
        rest = p.copy()
        rest[accepted] = 0.0
    need = K - len(accepted)
    support = np.flatnonzero(rest > 0)
    more = [int(support[i]) for i in sample_distinct(rest[support] / rest.sum(), need, generator)]
    if len(more) < need:  # the residual's support ran out: fill from p
        left = p.copy()
        left[accepted + more] = -1.0
        open_at = np.flatnonzero(left >= 0)
        left = np.maximum(left[open_at], 0.0)
        more += [int(open_at[i]) for i in sample_distinct(left / max(left.sum(), 1e-300), need - len(more), generator)]
    return accepted + more, False


class RelaxedBeamVerifier(BeamVerifier):
    """AtSpeed-R over the drafted steps in ``state.drafted`` ([(drafted sequences, {sequence: q}), ...])."""

    def __init__(self, broken_residual: bool = False):
        self.broken_residual = broken_residual

    def verify_beams(self, tree: DraftTree, log_probs: torch.Tensor, request: Request) -> Outcome:
        st: BeamState = request.state
        drafted = st.drafted
        steps = 0
        for j in range(len(drafted) + 1):
            if st.finished:
                break
            seqs, scores = candidates(st.hyps, {h.seq: log_probs[st.tree.row(h.seq)] for h in st.live}, st.trie)
            p = beam_probs(scores)
            if j < len(drafted):
                dseqs, qmap = drafted[j]
                index = {s: i for i, s in enumerate(seqs)}
                q = np.array([qmap.get(s, 0.0) for s in seqs])
                chosen, ok = relaxed_accept(
                    p, q, [index[s] for s in dseqs if s in index], st.width, request.generator, self.broken_residual
                )
            else:  # every drafted step accepted (or none drafted): sample the next step from p
                chosen, ok = sample_distinct(p, st.width, request.generator), False
            st.hyps = sorted(
                (Hyp(seqs[i], float(scores[i]), st.trie.item(seqs[i]) is not None) for i in chosen),
                key=lambda h: (-h.score, h.seq),
            )
            steps += 1
            if not ok:
                break
        st.steps_per_forward.append(steps)
        return beam_outcome(st)
