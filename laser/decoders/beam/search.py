"""Constrained beam search over item identifiers, run through the engine's beam hook.

- :class:`ItemTrie` the constraint: a pygtrie token trie over the valid item identifiers, each ending
  with an end token (so a complete identifier is a leaf and no identifier hides inside another).
- :class:`Hyp` one beam: its token sequence (after the prompt), cumulative log-probability and whether
  it is a complete identifier.
- :func:`beam_step` one step of constrained beam search of width ``W``: the finished beams compete with
  every allowed extension of the live beams; the ``W`` best survive (ties: lower token sequence first).
  Finished beams are frozen (they extend with probability 1), so every step keeps exactly ``W`` beams
  and the search ends when all of them are complete identifiers.
- :class:`BeamSearchVerifier` the engine's :class:`~laser.verify.BeamVerifier` for ``beam`` and strict
  ``atspeed``: from one forward over a tree holding the live beams (and, for atspeed, drafted beams) it
  runs beam steps while every live beam's next-token row is in the tree. With no drafts that is one step
  per forward; with drafts it is the strict top-K rule (a step is accepted iff the target's own beams
  were all drafted), so the result is exactly plain beam search's.

The live beams' shared prefixes stay in the target's KV cache between steps (``Outcome.keep``), so a
step feeds only the live beams' ends and the drafted nodes.

Scores are the model's own log-probabilities (the constraint masks, it does not renormalise), as
``generate`` with ``prefix_allowed_tokens_fn`` scores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pygtrie
import torch

from laser.drafting import Drafter
from laser.request import Request
from laser.tree import DraftTree
from laser.verify import BeamVerifier, Outcome

Seq = tuple[int, ...]


class ItemTrie:
    """Valid item identifiers as token sequences (each + ``end_token``) in a pygtrie trie."""

    def __init__(self, identifiers: Mapping[str, Sequence[int]], end_token: int):
        self.end_token = int(end_token)
        self.trie = pygtrie.Trie()
        self._children: dict[Seq, list[int]] = {}
        for item_id, tokens in identifiers.items():
            seq = tuple(int(t) for t in tokens)
            if not seq:
                raise ValueError(f"item {item_id!r} has an empty identifier (no tokens)")
            if self.end_token in seq:
                raise ValueError(f"item {item_id!r}: its identifier contains the end token {self.end_token}")
            key = seq + (self.end_token,)
            if key in self.trie:
                raise ValueError(
                    f"items {self.trie[key]!r} and {item_id!r} have the same identifier tokens {list(seq)}"
                )
            self.trie[key] = str(item_id)
            for i in range(len(key)):
                self._children.setdefault(key[:i], []).append(key[i])
        if not self.trie:
            raise ValueError("the item trie is empty: no valid item identifiers")
        self._children = {k: sorted(set(v)) for k, v in self._children.items()}
        self._allowed_t = {k: torch.tensor(v, dtype=torch.long) for k, v in self._children.items()}

    def __len__(self) -> int:
        return len(self.trie)

    def allowed(self, seq: Seq) -> torch.Tensor:
        """Token ids that may follow ``seq`` (empty for a complete identifier or an invalid prefix)."""
        return self._allowed_t.get(seq, torch.empty(0, dtype=torch.long))

    def item(self, seq: Seq) -> str | None:
        """The item a complete identifier (end token included) names; None for a prefix."""
        item: str | None = self.trie.get(seq)  # pygtrie is untyped; the values are the item ids stored above
        return item

    @cached_property
    def vocab(self) -> list[int]:
        """Every token an identifier may use, the end token included."""
        return sorted({t for ts in self._children.values() for t in ts})

    @property
    def max_len(self) -> int:
        return max(len(k) for k in self.trie.keys())


@dataclass(frozen=True)
class Hyp:
    seq: Seq
    score: float
    done: bool = False


def initial_beams() -> list[Hyp]:
    return [Hyp((), 0.0)]


def candidates(hyps: Sequence[Hyp], rows: Mapping[Seq, torch.Tensor], trie: ItemTrie) -> tuple[list[Seq], np.ndarray]:
    """A beam step's candidates: the finished beams, then every allowed extension of each live beam
    (``rows[h.seq]``: its ``[V]`` next-token log-probs), with their cumulative scores."""
    seqs: list[Seq] = [h.seq for h in hyps if h.done]
    scores: list[np.ndarray] = [np.array([h.score for h in hyps if h.done], dtype=np.float64)]
    for h in hyps:
        if h.done:
            continue
        allowed = trie.allowed(h.seq)
        lp = rows[h.seq].float().cpu()[allowed].double().numpy()
        scores.append(h.score + lp)
        seqs.extend(h.seq + (int(t),) for t in allowed)
    return seqs, np.concatenate(scores)


def beam_probs(scores: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The beam-level distribution over candidates: p(c) proportional to exp(score(c)) (temperature 1)."""
    w = np.exp(scores - scores.max())
    probs: npt.NDArray[np.float64] = w / w.sum()  # numpy types a scalar sum as Any
    return probs


def beam_step(hyps: Sequence[Hyp], rows: Mapping[Seq, torch.Tensor], trie: ItemTrie, width: int) -> list[Hyp]:
    """One constrained beam step: the ``width`` best candidates (ties: lower token sequence first)."""
    seqs, flat = candidates(hyps, rows, trie)
    # best first; equal scores: lower token sequence first (deterministic)
    order = (
        sorted(range(len(seqs)), key=lambda i: (-flat[i], seqs[i]))[:width]
        if len(seqs) <= 4 * width
        else _top_order(flat, seqs, width)
    )
    return [Hyp(seqs[i], float(flat[i]), trie.item(seqs[i]) is not None) for i in order]


def _top_order(flat: np.ndarray, seqs: list[Seq], width: int) -> list[int]:
    """Indices of the ``width`` best candidates (ties by sequence) without sorting them all."""
    k = min(width, len(flat))
    cut = np.partition(-flat, k - 1)[k - 1]
    keep = np.nonzero(-flat <= cut)[0]
    return sorted(keep.tolist(), key=lambda i: (-flat[i], seqs[i]))[:width]


@dataclass
class PrefixTree:
    """How a request's beams are laid out as each step's tree, with their prefixes kept in the KV cache.

    A step's tree is: the nodes kept from the last step (``kept``: the tree's ``cached`` nodes), then the
    beams' ends (fed: their rows give the next step), then any drafted nodes. ``nodes`` maps a sequence to
    its node (a fed copy before a cached one), so a fed node's log-probability row is ``nodes[seq] -
    cached``. After verification :meth:`keep` names the nodes to keep: every strict prefix of a beam.
    """

    nodes: dict[Seq, int] = field(default_factory=dict)  # sequence -> node of the current tree
    cached: int = 0  # leading tree nodes already in the cache
    kept: list[Seq] = field(default_factory=list)  # the next tree's cached nodes, in order
    kept_from: list[int] = field(default_factory=list)  # their nodes in the current tree

    def lay_out(self, root: int, ends: Sequence[Seq]) -> tuple[list[int], list[int]]:
        """The step's tree so far: the kept nodes, then the beams' ends (tokens, parents)."""
        tokens: list[int] = []
        parents: list[int] = []
        self.nodes = {}
        for seq in self.kept:
            self.nodes[seq] = len(tokens)
            tokens.append(seq[-1] if seq else root)
            parents.append(self.nodes[seq[:-1]] if seq else -1)
        self.cached = len(tokens)
        if not self.kept:
            self.nodes[()] = 0
            tokens.append(root)
            parents.append(-1)
        for seq in ends:
            for d in range(1, len(seq)):  # prefixes are normally kept; a missing one is fed
                if seq[:d] not in self.nodes:
                    self.add(seq[:d], tokens, parents)
            if seq:
                self.add(seq, tokens, parents)
        return tokens, parents

    def add(self, seq: Seq, tokens: list[int], parents: list[int]) -> None:
        """Append ``seq``'s last token as a fed node under its prefix's node (once per step)."""
        if seq in self.nodes and self.nodes[seq] >= self.cached:
            return
        parent = self.nodes[seq[:-1]]
        self.nodes[seq] = len(tokens)
        tokens.append(seq[-1])
        parents.append(parent)

    def row(self, seq: Seq) -> int | None:
        """``seq``'s row in the step's log-probabilities (None: not fed this step)."""
        node = self.nodes.get(seq, -1)
        return node - self.cached if node >= self.cached else None

    def rows(self, log_probs: torch.Tensor) -> dict[Seq, torch.Tensor]:
        """Every fed sequence's log-probability row."""
        return {seq: log_probs[i - self.cached] for seq, i in self.nodes.items() if i >= self.cached}

    def keep(self, beams: Sequence[Seq]) -> list[int]:
        """The tree nodes to keep cached: every strict prefix of ``beams`` (cached copies first), in tree
        order; recorded as the next tree's ``kept``."""
        cached = {seq: i for i, seq in enumerate(self.kept)}
        want = {seq[:d] for seq in beams for d in range(len(seq))}
        pairs = sorted((cached[seq] if seq in cached else self.nodes[seq], seq) for seq in want)
        self.kept_from = [i for i, _ in pairs]
        self.kept = [seq for _, seq in pairs]
        return self.kept_from


@dataclass
class BeamState:
    """A request's beam search (its ``request.state``); ``tree`` lays its beams out. ``drafted``: the draft's
    sampled steps of the current iteration, written by a relaxed drafter for its verifier."""

    trie: ItemTrie
    width: int
    hyps: list[Hyp] = field(default_factory=initial_beams)
    tree: PrefixTree = field(default_factory=PrefixTree)
    steps_per_forward: list[int] = field(default_factory=list)
    drafted: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"beam width must be >= 1, got {self.width}")
        if self.width > len(self.trie):
            raise ValueError(f"beam width K={self.width} is larger than the number of valid items ({len(self.trie)})")

    @property
    def live(self) -> list[Hyp]:
        return [h for h in self.hyps if not h.done]

    @property
    def finished(self) -> bool:
        return not self.live

    def ranked(self) -> list[tuple[str, float]]:
        """(item_id, score) best first, once every beam is a complete identifier."""
        out = []
        for h in self.hyps:
            item = self.trie.item(h.seq)
            if item is None:
                raise RuntimeError(f"beam {list(h.seq)} is not a complete item identifier yet")
            out.append((item, h.score))
        return out

    def lay_out(self, root: int) -> tuple[list[int], list[int]]:
        return self.tree.lay_out(root, [h.seq for h in self.live])


class BeamDrafter(Drafter):
    """Lays the live beams out as the step's tree (no drafts): plain beam search, one step per forward."""

    def __init__(self, state: BeamState):
        self.state = state

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        tokens, parents = self.state.lay_out(context[-1])
        return DraftTree(np.array(tokens), np.array(parents), cached=self.state.tree.cached)


class BeamSearchVerifier(BeamVerifier):
    """Runs beam steps while every live beam's row is in the tree (strict top-K verification)."""

    def verify_beams(self, tree: DraftTree, log_probs: torch.Tensor, request: Request) -> Outcome:
        st: BeamState = request.state
        steps = 0
        while not st.finished and all(st.tree.row(h.seq) is not None for h in st.live):
            rows = {h.seq: log_probs[st.tree.row(h.seq)] for h in st.live}
            st.hyps = beam_step(st.hyps, rows, st.trie, st.width)
            steps += 1
        st.steps_per_forward.append(steps)
        return beam_outcome(st)


def beam_outcome(st: BeamState) -> Outcome:
    """Nothing committed; the live beams' prefixes stay cached; the request ends with its last live beam."""
    return Outcome(
        path=[], tokens=[], finished=st.finished, keep=None if st.finished else st.tree.keep([h.seq for h in st.live])
    )
