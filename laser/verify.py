"""Verifiers: one target forward's logits over a batch of draft trees -> what each request keeps.

Every verifier returns, per request, an :class:`Outcome`: the tree nodes whose KV stays in the cache
(root first) and the tokens appended to the request (the accepted drafts, then the correction/bonus).

- :class:`TopKVerifier` greedy (``k=1``): accept x_i iff x_i == argmax q_j at its parent j (lossless);
  relaxed (``k>1``): also accept x_i in TopK(q_j, k) with q_j(x_i) > p (LASER, Eq. 8), except on a
  request marked ``exact`` (a greedy row in a relaxed batch, e.g. a retry), and except where x_i would
  complete a token ``fresh_n``-gram the generated text already holds (:func:`repeats`): the relaxed rule
  never extends a repetition the target itself would not take (its argmax). Vectorised: the longest fully
  accepted path wins (ties to depth-first order), then the argmax after it.
- :class:`RejectionSampler` speculative sampling. A chain with draft distributions is standard
  speculative sampling (Leviathan et al. 2023); a tree is verified by multi-draft rejection: at a node,
  children are tried in order, child x accepted with probability min(1, p(x)/q(x)), and on rejection the
  target distribution becomes the residual norm(max(0, p - q)). Deterministic drafts count as one-hot q,
  so trie drafts sample exactly from the target too. Greedy rows (temperature 0) take the greedy path.
- :class:`BeamVerifier` the hook for speculative beam search: it sees each request's tree with per-node
  log-probabilities and owns the request's beam state; :func:`expand_beams` is its scoring core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from laser.defaults import RELAXED_FRESH_N
from laser.request import Request
from laser.sampling import sample, target_probs
from laser.tree import DraftTree, TreeBatch


@dataclass
class Outcome:
    """One request's result of a step: ``path`` nodes keep their KV (root first, may be empty); ``tokens``
    are appended to the request. ``len(tokens) == len(path)`` keeps the last token as the next root.

    ``keep`` (beam verifiers) instead keeps a subtree uncommitted: those nodes (root first, each after its
    parent) stay in the cache after the request's prefix, and the request's next tree must begin with
    them, in that order, as its ``cached`` nodes (the engine checks).
    """

    path: list[int]
    tokens: list[int]
    finished: bool = False  # the verifier ends the request (beam search decides its own end)
    keep: list[int] | None = None


class Verifier:
    """Base class: ``verify`` turns a forward's logits ``[B, N, V]`` into one Outcome per request."""

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence[Request]) -> list[Outcome]:
        raise NotImplementedError


def repeats(text: Sequence[int], path: Sequence[int], n: int) -> list[bool]:
    """For each draft token of ``path`` (a chain after ``text``, whose last token is the chain's root): whether
    it completes a token ``n``-gram that ``text`` followed by the path before it already holds (:func:`tree_repeats`
    on the chain). ``n < 2``: never."""
    return tree_repeats(text, DraftTree.chain(text[-1] if text else 0, list(path)), n)[1:]


def tree_repeats(text: Sequence[int], tree: DraftTree, n: int) -> list[bool]:
    """:func:`repeats` for every node of ``tree`` (root: False), each judged on its own root-to-node path."""
    out = [False] * len(tree)
    if n < 2:
        return out
    seen = {tuple(text[i : i + n]) for i in range(len(text) - n + 1)}
    paths: list[tuple[int, ...]] = [tuple(text[-(n - 1) :])]  # each node's last n-1 tokens
    grams: list[frozenset[tuple[int, ...]]] = [frozenset()]  # n-grams on the path to each node (after text)
    for i in range(1, len(tree)):
        parent = int(tree.parents[i])
        gram = paths[parent] + (int(tree.tokens[i]),)
        whole = len(gram) == n
        out[i] = whole and (gram in seen or gram in grams[parent])
        paths.append(gram[1:] if whole else gram)
        grams.append(grams[parent] | {gram} if whole else grams[parent])
    return out


@dataclass(frozen=True)
class TopKVerifier(Verifier):
    """Greedy (``k=1``) or relaxed (``k>1``, threshold ``p``; no non-argmax token that completes a repeated
    ``fresh_n``-gram of the generated text) verification."""

    k: int = 1
    p: float = 0.0
    fresh_n: int = RELAXED_FRESH_N

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"verification k must be an integer >= 1, got {self.k!r}")
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"verification p must lie in [0, 1), got {self.p!r}")

    def accept_nodes(
        self,
        logits: torch.Tensor,
        batch: TreeBatch,
        exact: torch.Tensor | None = None,
        stale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, N]`` bool: is each node's own token acceptable at its parent's row (root: True); ``exact``
        ``[B]`` bool: rows held to the greedy rule; ``stale`` ``[B, N]`` bool: nodes only the greedy rule may
        accept (they repeat an n-gram)."""
        # logits [B, N, V]. Row statistics once per tree row, then read at each node's parent row.
        rows = batch.parents.clamp(min=0)  # [B, N] root and padding read row 0, masked below

        def at_parent(t: torch.Tensor) -> torch.Tensor:  # [B, N] row stat -> node
            return t.gather(1, rows)

        b_idx = torch.arange(logits.shape[0], device=logits.device)[:, None]
        draft_logit = logits[b_idx, rows, batch.tokens.clamp(min=0)]  # [B, N]
        ok = batch.tokens == at_parent(logits.argmax(-1))
        if self.k > 1:
            kth = logits.topk(self.k, dim=-1).values[..., -1]  # [B, N]
            log_prob = draft_logit.float() - at_parent(torch.logsumexp(logits.float(), dim=-1))
            relaxed = (draft_logit >= at_parent(kth)) & (log_prob.exp() > self.p)
            if exact is not None:
                relaxed &= ~exact[:, None]
            if stale is not None:
                relaxed &= ~stale
            ok |= relaxed
        return (ok | (batch.parents < 0)) & batch.node_valid

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence[Request] = ()) -> list[Outcome]:
        exact = [r.exact for r in requests]
        held = torch.tensor(exact, device=logits.device) if any(exact) else None
        return select_paths(logits, batch, self.accept_nodes(logits, batch, held, self.stale(batch, requests)))

    def stale(self, batch: TreeBatch, requests: Sequence[Request]) -> torch.Tensor | None:
        """``[B, N]``: the nodes that repeat a ``fresh_n``-gram of their request's generated text (None when
        the rule is greedy, off, or nothing repeats)."""
        if self.k == 1 or self.fresh_n < 2 or not requests or len(batch.trees) != len(requests):
            return None
        out = torch.zeros(batch.tokens.shape, dtype=torch.bool)
        for b, (tree, req) in enumerate(zip(batch.trees, requests)):
            flags = tree_repeats(req.tokens[req.prompt_len :], tree, self.fresh_n)[tree.cached :]
            if any(flags):
                out[b, : len(flags)] = torch.tensor(flags)
        return out.to(batch.tokens.device) if out.any() else None


def select_paths(logits: torch.Tensor, batch: TreeBatch, node_ok: torch.Tensor) -> list[Outcome]:
    """Longest fully accepted root-to-node path per tree, then the argmax after it."""
    # A node is reachable when no ancestor-or-self is rejected.
    reachable = ~(batch.ancestors & ~node_ok[:, None, :]).any(-1)  # [B, N]
    score = torch.where(reachable, batch.depth, torch.full_like(batch.depth, -1))
    best = score.argmax(dim=1)  # first maximum = DFS order tie-break; [B]
    rows = torch.arange(len(best), device=best.device)
    on_path = batch.ancestors[rows, best]  # [B, N]
    next_token = logits[rows, best].argmax(-1).tolist()  # [B]
    tokens = batch.tokens.cpu()
    out = []
    for b, row in enumerate(on_path.cpu()):
        path = row.nonzero().flatten().tolist()
        out.append(Outcome(path, tokens[b, path[1:]].tolist() + [next_token[b]]))
    return out


class RejectionSampler(Verifier):
    """Speculative sampling on chains and multi-draft rejection on trees; exact for any draft.

    ``broken_residual`` is for tests only: it resamples from p instead of the residual after a
    rejection, which biases the output towards drafted tokens (the statistical tests must catch it).
    """

    def __init__(self, broken_residual: bool = False):
        self.broken_residual = broken_residual
        self._greedy = TopKVerifier(1)

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence[Request]) -> list[Outcome]:
        greedy_rows = [b for b, r in enumerate(requests) if r.sampling.greedy]
        out: dict[int, Outcome] = {}
        if greedy_rows:  # temperature 0: the vectorised greedy rule (what rejection reduces to)
            verdicts = self._greedy.verify(logits, batch)
            for b in greedy_rows:
                out[b] = verdicts[b]
        for b, req in enumerate(requests):
            if b not in out:
                tree = batch.trees[b]
                probs = target_probs(logits[b, : len(tree)], req.sampling)
                out[b] = self.verify_tree(tree, probs, req.generator)
        return [out[b] for b in range(len(requests))]

    def verify_tree(self, tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Outcome:
        """Walk down from the root: accept a child by min(1, p/q), else move p to the residual."""
        children = tree.children()
        node, path = 0, [0]
        while True:
            p = probs[node].clone()
            accepted = None
            for child in children[node]:
                x = int(tree.tokens[child])
                q = self._draft_dist(tree, node, x, p)
                if float(torch.rand((), generator=generator)) * q[x] < p[x]:  # u < p(x) / q(x)
                    accepted = child
                    break
                if not self.broken_residual:
                    p = torch.clamp(p - q, min=0.0)
                    total = p.sum()
                    p = p / total if total > 0 else probs[node]
            if accepted is None:
                nxt = sample(p, generator)
                return Outcome(path, [int(t) for t in tree.tokens[path[1:]]] + [nxt])
            node = accepted
            path.append(node)

    @staticmethod
    def _draft_dist(tree: DraftTree, node: int, token: int, like: torch.Tensor) -> torch.Tensor:
        """The distribution the child ``token`` of ``node`` was drawn from: the drafter's, or one-hot."""
        if tree.draft_dists is not None:
            return tree.draft_dists[node].to(like.device, torch.float32)
        return torch.zeros_like(like).index_fill_(0, torch.tensor([token], device=like.device), 1.0)


class BeamVerifier(Verifier):
    """Hook for speculative beam search: subclasses implement :meth:`verify_beams` for one request.

    The verifier gets each request's tree with the next-token log-probabilities of its fed nodes
    (``[len(tree) - tree.cached, V]``, fp32: row i is node ``tree.cached + i``); it keeps the request's beams
    in ``request.state`` and returns an Outcome that commits nothing (``path=[]``) and keeps the beams'
    prefixes (``keep``), and ends the request when done.
    """

    def verify(self, logits: torch.Tensor, batch: TreeBatch, requests: Sequence[Request]) -> list[Outcome]:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return [
            self.verify_beams(tree, log_probs[b, : len(tree) - tree.cached], req)
            for b, (tree, req) in enumerate(zip(batch.trees, requests))
        ]

    def verify_beams(self, tree: DraftTree, log_probs: torch.Tensor, request: Request) -> Outcome:
        raise NotImplementedError


def expand_beams(
    tree: DraftTree, log_probs: torch.Tensor, nodes: Sequence[int], width: int
) -> list[tuple[int, int, float]]:
    """The ``width`` best one-token extensions of ``nodes``: ``(node, token, score)``, best first.

    A node's score is ``tree.scores[node]`` (the cumulative log-probability of the sequence ending at it,
    0 for the root when ``scores`` is None) plus the extension's log-probability. This is one step of beam
    search read off one forward: strict top-K verification compares these with the drafted beams.
    """
    base = torch.as_tensor([0.0 if tree.scores is None else float(tree.scores[n]) for n in nodes])
    cand = base[:, None] + log_probs[list(nodes)].cpu()  # [M, V]
    top = cand.flatten().topk(min(width, cand.numel()))
    vocab = cand.shape[1]
    return [(int(nodes[i // vocab]), int(i % vocab), float(v)) for v, i in zip(top.values, top.indices)]
