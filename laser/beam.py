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

Scores are the model's own log-probabilities (the constraint masks, it does not renormalise), as
``generate`` with ``prefix_allowed_tokens_fn`` scores them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
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
                raise ValueError(f"items {self.trie[key]!r} and {item_id!r} have the same identifier tokens {list(seq)}")
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
        return self.trie.get(seq)

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


def beam_probs(scores: np.ndarray) -> np.ndarray:
    """The beam-level distribution over candidates: p(c) proportional to exp(score(c)) (temperature 1)."""
    w = np.exp(scores - scores.max())
    return w / w.sum()


def beam_step(hyps: Sequence[Hyp], rows: Mapping[Seq, torch.Tensor], trie: ItemTrie, width: int) -> list[Hyp]:
    """One constrained beam step: the ``width`` best candidates (ties: lower token sequence first)."""
    seqs, flat = candidates(hyps, rows, trie)
    # best first; equal scores: lower token sequence first (deterministic)
    order = sorted(range(len(seqs)), key=lambda i: (-flat[i], seqs[i]))[:width] if len(seqs) <= 4 * width else \
        _top_order(flat, seqs, width)
    return [Hyp(seqs[i], float(flat[i]), trie.item(seqs[i]) is not None) for i in order]


def _top_order(flat: np.ndarray, seqs: list[Seq], width: int) -> list[int]:
    """Indices of the ``width`` best candidates (ties by sequence) without sorting them all."""
    k = min(width, len(flat))
    cut = np.partition(-flat, k - 1)[k - 1]
    keep = np.nonzero(-flat <= cut)[0]
    return sorted(keep.tolist(), key=lambda i: (-flat[i], seqs[i]))[:width]


@dataclass
class BeamState:
    """A request's beam search, kept in ``request.state["beam"]``."""

    trie: ItemTrie
    width: int
    hyps: list[Hyp] = field(default_factory=initial_beams)
    nodes: dict[Seq, int] = field(default_factory=dict)  # sequence -> node of the current tree
    steps_per_forward: list[int] = field(default_factory=list)

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
        """(item_id, score) best first."""
        return [(self.trie.item(h.seq), h.score) for h in self.hyps]


def layout(root: int, seqs: Sequence[Seq]) -> tuple[list[int], list[int], dict[Seq, int]]:
    """Tokens and parents of a tree holding every prefix of ``seqs`` under ``root`` (parents first)."""
    nodes: dict[Seq, int] = {(): 0}
    tokens, parents = [root], [-1]
    for seq in seqs:
        for d in range(1, len(seq) + 1):
            if seq[:d] not in nodes:
                nodes[seq[:d]] = len(tokens)
                tokens.append(seq[d - 1])
                parents.append(nodes[seq[:d - 1]])
    return tokens, parents, nodes


class BeamDrafter(Drafter):
    """Lays the live beams out as the step's tree (no drafts): plain beam search, one step per forward."""

    def __init__(self, state: BeamState):
        self.state = state

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        tokens, parents, nodes = layout(context[-1], [h.seq for h in self.state.live])
        self.state.nodes = nodes
        return DraftTree(np.array(tokens), np.array(parents))


class BeamSearchVerifier(BeamVerifier):
    """Runs beam steps while every live beam's row is in the tree (strict top-K verification)."""

    def verify_beams(self, tree: DraftTree, log_probs: torch.Tensor, request: Request) -> Outcome:
        st: BeamState = request.state["beam"]
        steps = 0
        while not st.finished and all(h.seq in st.nodes for h in st.live):
            rows = {h.seq: log_probs[st.nodes[h.seq]] for h in st.live}
            st.hyps = beam_step(st.hyps, rows, st.trie, st.width)
            steps += 1
        st.steps_per_forward.append(steps)
        return Outcome(path=[], tokens=[], finished=st.finished)
