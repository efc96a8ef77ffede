"""DSBD: dynamic-width speculative beam sampling (beam sampling accelerated by a draft model).

Beam sampling keeps a multiset of beams; a step draws W beams i.i.d. from the beam-level distribution
p_beam over (beam, next token): mass(b, v) = exp(score_b) p(v | b) / Z, a finished beam (ended with an
end token) keeping its mass in a "stay" column (it does not extend). Beams are stored de-duplicated
with a multiplicity, so a ``[B, V + 1]`` matrix holds the distribution (column V = stay).

One iteration (notes, errata applied): the draft model samples ``W_S`` beams per layer for ``gamma``
layers from the input beams; all drafted layers are laid out with the input beams as one forest (one
tree under the prompt's last token) and verified in one target forward; then layer by layer drafts are
accepted with min(1, p'(x) / q(x)), p' reset to p_beam after an acceptance and moved to the residual
norm(max(0, p' - q)) after a rejection (children of rejected parents have p = 0 and still update p').
A layer with fewer than W acceptances draws one beam from p', fills up to W from p_beam and ends the
iteration; if every layer passes, W beams are drawn from the next layer's p_beam.

The memory-saving one-cache variant (``one_cache``) keeps a single input beam between iterations: the
output beam of lowest perplexity (see :meth:`Beams.lowest_perplexity`), so the forest is one tree and
the memory is that of plain speculative decoding. It is not distribution-equivalent to beam sampling.

:func:`acceptance_distribution` is the dynamic program for the number of accepted drafts and
:func:`dynamic_width` the layer width it gives (``W_L = max(W_min, max{K : P(accepted >= K) >= t})``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import numpy.typing as npt
import torch

from laser.decoders.beam.search import PrefixTree, Seq
from laser.drafting import Drafter
from laser.request import Request
from laser.tree import DraftTree
from laser.verify import BeamVerifier, Outcome

if TYPE_CHECKING:
    from laser.decoders.beam.draft import TreeDraftModel

# ---- the dynamic program --------------------------------------------------------------------------


def acceptance_rates(p: np.ndarray, q: np.ndarray, m: int) -> np.ndarray:
    """alpha_j, j = 1..m: the chance that the j-th draft since the last acceptance is accepted
    (alpha_j = sum min(p_j, q), p_1 = p, p_k = norm(max(p_{k-1} - q, 0)))."""
    out, pj = np.zeros(m), p.astype(np.float64)
    for j in range(m):
        out[j] = np.minimum(pj, q).sum()
        rest = np.maximum(pj - q, 0.0)
        if rest.sum() <= 1e-15:
            out[j:] = out[j]
            break
        pj = rest / rest.sum()
    return np.clip(out, 0.0, 1.0)


def acceptance_distribution(alpha: np.ndarray) -> np.ndarray:
    """``P[m, k]``: the chance of k acceptances among m i.i.d. drafts, for m, k = 0..len(alpha).

    P~(i) = alpha_i prod_{j<i} (1 - alpha_j) (first acceptance at draft i, the chain restarting after it);
    P(m, k) = sum_{i<=m} P~(i) P(m - i, k - 1); P(0, 0) = 1; P(m, 0) = prod_{j<=m} (1 - alpha_j).
    """
    M = len(alpha)
    survive = np.concatenate([[1.0], np.cumprod(1 - alpha)])  # prod_{j<i} (1 - alpha_j), i = 1..M+1
    first = np.array([alpha[i - 1] * survive[i - 1] for i in range(1, M + 1)])
    P = np.zeros((M + 1, M + 1))
    for m in range(M + 1):
        P[m, 0] = survive[m]
        for k in range(1, m + 1):
            P[m, k] = sum(first[i - 1] * P[m - i, k - 1] for i in range(1, m + 1))
    return P


def dynamic_width(p: np.ndarray, q: np.ndarray, m: int, t: float, w_min: int) -> int:
    """Layer width: the largest K whose chance of at least K acceptances among ``m`` drafts is >= ``t``,
    at least ``w_min``."""
    P = acceptance_distribution(acceptance_rates(p, q, m))[m]
    at_least = 1.0 - np.concatenate([[0.0], np.cumsum(P)[:-1]])  # at_least[K] = P(acc >= K)
    ok = [k for k in range(1, m + 1) if at_least[k] >= t]
    return max(w_min, max(ok, default=0))


# ---- one layer's verification ---------------------------------------------------------------------


def draw(probs: np.ndarray, n: int, generator: torch.Generator) -> list[int]:
    """``n`` i.i.d. draws from a flat distribution."""
    if n <= 0:
        return []
    return torch.multinomial(
        torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float64)), n, replacement=True, generator=generator
    ).tolist()


def verify_layer(
    p: np.ndarray,
    q: np.ndarray,
    drafted: Sequence[int],
    width: int,
    generator: torch.Generator,
    broken_residual: bool = False,
) -> tuple[list[int], int]:
    """(``width`` chosen candidate indices, how many were accepted drafts) for flat p_beam and q_beam;
    the layer passed when all ``width`` were.

    ``drafted`` holds the drafted candidates in draft order (-1: a child of a rejected parent, p = 0).
    ``broken_residual`` (tests only) keeps p' = p_beam after a rejection.
    """
    accepted: list[int] = []
    pp = p
    for x in drafted:
        if len(accepted) == width:
            break
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if x >= 0 and u * q[x] < pp[x]:
            accepted.append(x)
            pp = p
        elif not broken_residual:
            rest = np.maximum(pp - q, 0.0)
            pp = rest / rest.sum() if rest.sum() > 1e-15 else p
    if len(accepted) == width:
        return accepted, width
    return accepted + draw(pp, 1, generator) + draw(p, width - len(accepted) - 1, generator), len(accepted)


# ---- beams as a multiset, and their beam-level distribution ---------------------------------------


@dataclass
class Beams:
    """Distinct beam sequences with multiplicity and cumulative target log-probability."""

    seqs: list[Seq]
    counts: list[int]
    scores: list[float]

    @classmethod
    def start(cls) -> "Beams":
        return cls([()], [1], [0.0])

    def __len__(self) -> int:
        return sum(self.counts)

    def mean_logprob(self, i: int) -> float:
        """Beam ``i``'s mean target log-probability per generated token (its score / its length, an end
        token counted); the highest mean is the lowest perplexity exp(-mean)."""
        return self.scores[i] / max(1, len(self.seqs[i]))

    def lowest_perplexity(self) -> "Beams":
        """The single beam of highest mean log-probability per token (first in sorted order on ties), count 1."""
        i = max(range(len(self.seqs)), key=self.mean_logprob)
        return Beams([self.seqs[i]], [1], [self.scores[i]])


def beam_matrix(
    beams: Beams, rows: dict[Seq, torch.Tensor], ends: set[int], temperature: float = 1.0
) -> npt.NDArray[np.float64]:
    """``[B, V + 1]`` beam-level probabilities (column V: a finished beam stays as it is)."""
    V = next(iter(rows.values())).shape[-1] if rows else 1
    mass = np.zeros((len(beams.seqs), V + 1))
    logw = np.array(beams.scores) + np.log(np.array(beams.counts, dtype=np.float64))
    logw = logw - logw.max()
    for b, seq in enumerate(beams.seqs):
        if finished(seq, ends):
            mass[b, V] = np.exp(logw[b])
        else:
            lp = torch.log_softmax(rows[seq].float().cpu().double() / temperature, -1).numpy()
            mass[b, :V] = np.exp(logw[b] + lp)
    probs: npt.NDArray[np.float64] = mass / mass.sum()  # numpy types a scalar sum as Any
    return probs


def finished(seq: Seq, ends: set[int]) -> bool:
    return bool(seq) and seq[-1] in ends


def child(beams: Beams, index: int, vocab: int) -> Seq:
    b, v = divmod(index, vocab + 1)
    return beams.seqs[b] if v == vocab else beams.seqs[b] + (v,)


def candidate_index(beams: Beams, seq: Seq, vocab: int, ends: set[int]) -> int:
    """Flat index of ``seq`` among the children of ``beams`` (-1: not a child of any of them)."""
    pos = {s: b for b, s in enumerate(beams.seqs)}
    if seq in pos and finished(seq, ends):
        return pos[seq] * (vocab + 1) + vocab
    b = pos.get(seq[:-1])
    if b is None or not seq or finished(beams.seqs[b], ends):
        return -1
    return b * (vocab + 1) + seq[-1]


def next_beams(beams: Beams, chosen: Sequence[int], rows: dict[Seq, torch.Tensor], vocab: int) -> Beams:
    """The multiset of chosen children with their target scores."""
    counts: dict[Seq, int] = {}
    scores: dict[Seq, float] = {}
    for idx in chosen:
        b, v = divmod(idx, vocab + 1)
        seq = child(beams, idx, vocab)
        if seq not in scores:
            step = 0.0 if v == vocab else float(torch.log_softmax(rows[beams.seqs[b]].float(), -1)[v])
            scores[seq] = beams.scores[b] + step
        counts[seq] = counts.get(seq, 0) + 1
    seqs = sorted(scores)
    return Beams(seqs, [counts[s] for s in seqs], [scores[s] for s in seqs])


# ---- engine plumbing: state, drafter, verifier ------------------------------------------------------


@dataclass
class BeamSampleState:
    """A request's beam sampling (its ``request.state``)."""

    width: int  # W_L: input beams per iteration
    length: int  # tokens to generate (beams stop earlier at an end token)
    ends: set[int]
    beams: Beams = field(default_factory=Beams.start)
    tree: PrefixTree = field(default_factory=PrefixTree)  # the beams' layout, prefixes kept cached
    drafted: list[tuple[list[Seq], dict[Seq, np.ndarray]]] = field(default_factory=list)  # per draft layer
    layers_per_forward: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)  # the width used at every layer
    inputs: list[int] = field(default_factory=list)  # distinct input beams of every iteration
    forest_nodes: list[int] = field(default_factory=list)  # tree nodes verified by every forward

    @property
    def depth(self) -> int:
        return max(len(s) for s in self.beams.seqs)

    @property
    def done(self) -> bool:
        return self.depth >= self.length or all(finished(s, self.ends) for s in self.beams.seqs)

    def best(self) -> tuple[Seq, float]:
        i = int(np.argmax(self.beams.scores))
        return self.beams.seqs[i], self.beams.scores[i]

    @property
    def open_beams(self) -> list[Seq]:
        """The beams that still extend (not ended by an end token)."""
        return [s for s in self.beams.seqs if not finished(s, self.ends)]


class ForestDrafter(Drafter):
    """Input beams + (with a draft model) ``gamma`` layers of ``width`` beams sampled by the draft."""

    def __init__(
        self, state: BeamSampleState, draft: TreeDraftModel | None = None, gamma: int = 0, width: int = 1, seed: int = 0
    ) -> None:
        self.state, self.draft, self.gamma, self.width = state, draft, gamma, width
        self.generator = torch.Generator().manual_seed(seed + 1)

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        st = self.state
        kept_from = st.tree.kept_from
        tokens, parents = st.tree.lay_out(context[-1], st.open_beams)
        st.drafted = []
        if self.draft is not None and self.gamma:
            self._draft(self.draft, tokens, parents, self.draft.sync(kept_from, tokens, parents, st.tree.nodes))
        st.inputs.append(len(st.beams.seqs))
        st.forest_nodes.append(len(tokens))
        return DraftTree(np.array(tokens), np.array(parents), cached=st.tree.cached)

    def _draft(
        self, draft: TreeDraftModel, tokens: list[int], parents: list[int], rows: dict[Seq, torch.Tensor]
    ) -> None:
        st = self.state
        beams = st.beams
        for j in range(min(self.gamma, st.length - st.depth - 1)):
            q = beam_matrix(beams, rows, st.ends)
            vocab = q.shape[1] - 1
            picks = draw(q.ravel(), self.width, self.generator)
            st.drafted.append(([child(beams, i, vocab) for i in picks], dict(zip(beams.seqs, q))))
            beams = next_beams(beams, picks, rows, vocab)  # draft scores: target-based start, draft steps
            # open drafted beams get nodes (a beam ended by an end token is never extended: no node)
            new = [s for s in beams.seqs if not finished(s, st.ends) and st.tree.row(s) is None]
            first = len(tokens)
            for seq in new:
                st.tree.add(seq, tokens, parents)
            if new and j + 1 < self.gamma:
                lp = draft.feed(tokens[first:], parents[first:])
                rows.update({seq: lp[i] for i, seq in enumerate(new)})
            if not new:
                return


class BeamSampleVerifier(BeamVerifier):
    """Beam sampling (no drafts: one layer per forward) and DSBD's layer-by-layer verification;
    ``one_cache`` keeps only the lowest-perplexity beam as the next iteration's input."""

    def __init__(
        self,
        dynamic: bool = False,
        t: float = 0.7,
        w_min: int = 1,
        broken_residual: bool = False,
        one_cache: bool = False,
    ):
        self.dynamic, self.t, self.w_min, self.broken_residual = dynamic, t, w_min, broken_residual
        self.one_cache = one_cache

    def verify_beams(self, tree: DraftTree, log_probs: torch.Tensor, request: Request) -> Outcome:
        st: BeamSampleState = request.state
        rows = st.tree.rows(log_probs)
        layers = 0
        for layer in range(len(st.drafted) + 1):
            if st.done:
                break
            p = beam_matrix(st.beams, rows, st.ends)
            vocab = p.shape[1] - 1
            if layer == len(st.drafted):  # no (more) drafts: one layer of plain beam sampling
                chosen, passed = draw(p.ravel(), st.width, request.generator), False
                st.widths.append(st.width)
            else:
                chosen, passed = self._layer(st, p, vocab, layer, request.generator)
            st.beams = next_beams(st.beams, chosen, rows, vocab)
            layers += 1
            if not passed:
                break
        st.layers_per_forward.append(layers)
        if self.one_cache and not st.done:
            st.beams = st.beams.lowest_perplexity()
        if st.done:
            return Outcome(path=[], tokens=list(st.best()[0]), finished=True)
        return Outcome(path=[], tokens=[], keep=st.tree.keep(st.open_beams))

    def _layer(
        self, st: BeamSampleState, p: npt.NDArray[np.float64], vocab: int, layer: int, gen: torch.Generator
    ) -> tuple[list[int], bool]:
        dseqs, qrows = st.drafted[layer]
        zero = np.zeros(vocab + 1)
        q = np.stack([qrows.get(s, zero) for s in st.beams.seqs]).ravel()
        drafted = [candidate_index(st.beams, s, vocab, st.ends) for s in dseqs]
        width = dynamic_width(p.ravel(), q, len(dseqs), self.t, self.w_min) if self.dynamic else st.width
        st.widths.append(width)
        chosen, accepted = verify_layer(p.ravel(), q, drafted, width, gen, self.broken_residual)
        return chosen, accepted == width
