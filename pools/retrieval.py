"""Retrieval pools: prefix-subtree drafting from a token trie of earlier knowledge.

A :class:`RetrievalPool` holds the *permanent* branches (earlier knowledge of a group). Each request
opens a :class:`PoolDrafter` whose :class:`laser.own_text.OwnText` holds the *temporary* branches (the
prompt and the text generated so far); it is dropped whole when the request ends, so nothing temporary
outlives it.

Retrieval (LASER section 3.3, "dynamic n"): the prefix is the last n context tokens, n from ``n_max``
down to 1. A prefix whose subtree gives fewer than ``min_nodes`` drafts is shortened; the first one
that gives enough wins (otherwise the largest seen). The K most frequent nodes are kept, temporary
before permanent, depth <= ``max_depth``, and laid out depth-first with the best child first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from laser import DraftTree, Drafter
from laser.defaults import N_MAX
from laser.own_text import OwnText
from pools.trie import TokenTrie, paused_gc

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


class RetrievalPool:
    """Permanent branches of one group (or the global pool); opens drafters for requests.

    Args:
        window: tokens inserted from every position (default: 13).
        max_depth: deepest draft node below the root (default: 12).
        min_fraction: a subtree with fewer than ``min_fraction * K`` nodes counts as "much smaller than
            K" and the prefix is shortened (default: 0.25).
        max_trie_nodes: eviction cap on permanent nodes (LFU with halving), None for no cap.
    """

    def __init__(
        self, window: int = 13, max_depth: int = 12, min_fraction: float = 0.25, max_trie_nodes: int | None = None
    ):
        self.trie = TokenTrie(window)
        self.max_depth = max_depth
        self.min_fraction = min_fraction
        self.max_trie_nodes = max_trie_nodes
        self.texts = 0

    @classmethod
    def from_token_ids(cls, seqs: Sequence[Sequence[int]], **kwargs: Any) -> "RetrievalPool":
        pool = cls(**kwargs)
        with paused_gc():
            for seq in seqs:
                pool.add(seq)
        return pool

    @classmethod
    def from_texts(cls, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], **kwargs: Any) -> "RetrievalPool":
        """Pool of ``texts`` tokenised without special tokens (as generated knowledge is)."""
        ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        return cls.from_token_ids(ids, **kwargs)

    def add(self, token_ids: Sequence[int]) -> None:
        """Add one text's token ids as permanent branches."""
        self.trie.extend(token_ids)
        self.texts += 1
        if self.max_trie_nodes is not None:
            self.trie.evict(self.max_trie_nodes)

    def __len__(self) -> int:
        return len(self.trie)

    def open(
        self, prompt_ids: Sequence[int], max_nodes: int = 64, n_max: int = N_MAX, min_prob: float = 0.0
    ) -> "PoolDrafter":
        return PoolDrafter(self, prompt_ids, max_nodes, n_max, min_prob)

    def retrieve(
        self,
        context: Sequence[int],
        max_nodes: int = 64,
        n_max: int = N_MAX,
        temporary: OwnText | None = None,
        min_prob: float = 0.0,
    ) -> DraftTree:
        """Draft tree rooted at ``context[-1]`` from the permanent (and optional temporary) trie.

        ``min_prob`` > 0 keeps only nodes that followed the prefix at least that often (see
        :meth:`TokenTrie.top_subtree`): fewer, likelier drafts, for targets whose forward cost grows
        with the number of tree tokens (CPUs).
        """
        return _layout(context[-1], self.nodes(context, max_nodes, n_max, temporary, min_prob))

    def nodes(
        self,
        context: Sequence[int],
        max_nodes: int = 64,
        n_max: int = N_MAX,
        temporary: OwnText | None = None,
        min_prob: float = 0.0,
    ) -> list[tuple[int, ...]]:
        """The nodes :meth:`retrieve` lays out: paths below the root, prefix-closed, in priority order."""
        enough = max(1, int(self.min_fraction * max_nodes))
        best: list[tuple[int, ...]] = []
        for n in range(min(n_max, len(context)), 0, -1):
            prefix = tuple(context[-n:])
            nodes = _merge(
                [t.top_subtree(prefix, max_nodes, self.max_depth, min_prob) for t in (temporary, self.trie) if t],
                max_nodes,
            )
            if len(nodes) > len(best):
                best = nodes
            if len(best) >= enough:
                break
        return best


class PoolDrafter(Drafter):
    """Per-request drafter: the pool's permanent branches plus this request's temporary ones."""

    def __init__(
        self, pool: RetrievalPool, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float = 0.0
    ):
        if max_nodes < 0 or n_max < 1 or not 0.0 <= min_prob < 1.0:
            raise ValueError(
                f"need max_nodes >= 0, n_max >= 1, 0 <= min_prob < 1; got {max_nodes}, {n_max}, {min_prob}"
            )
        self.pool, self.max_nodes, self.n_max, self.min_prob = pool, max_nodes, n_max, min_prob
        self.temporary: OwnText | None = OwnText(pool.trie.window, prompt_ids, longest=n_max)
        self._match: tuple[int, int] | None = None  # (context length, match_length) of the last match asked

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        return _layout(context[-1], self._nodes(context, budget))

    def propose_chain(self, context: Sequence[int], budget: int | None = None) -> list[int]:
        return _first_path(self._nodes(context, budget))

    def _nodes(self, context: Sequence[int], budget: int | None) -> list[tuple[int, ...]]:
        nodes = self.max_nodes if budget is None else min(budget, self.max_nodes)
        if nodes == 0:
            return []
        # A prefix longer than the match has no continuation in either trie (a continued sequence's suffixes
        # are continued too), so retrieval starts at the match when it was just asked for this context.
        longest = self._match[1] if self._match is not None and self._match[0] == len(context) else self.n_max
        return self.pool.nodes(context, nodes, longest, self.temporary, self.min_prob)

    def _own(self) -> OwnText:
        if self.temporary is None:
            raise RuntimeError("PoolDrafter used after close()")
        return self.temporary

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self._own().extend(new_tokens)
        self._match = None

    def match_length(self, context: Sequence[int]) -> int:
        """The longest suffix of ``context`` (up to ``n_max`` tokens) that something followed, in this
        request's text or the pool: retrieval drafts nothing when it is 0."""
        n, top = 0, min(self.n_max, len(context))
        own = self._own()
        while n < top and (own.follows(context[-n - 1 :]) or self.pool.trie.follows(context[-n - 1 :])):
            n += 1
        self._match = (len(context), n)
        return n

    def close(self) -> None:
        self.temporary = None


def _merge(subtrees: list[list[tuple[tuple[int, ...], int]]], limit: int) -> list[tuple[int, ...]]:
    """Union of best-first node lists, earlier lists first, cut at ``limit``; stays prefix-closed."""
    seen: dict[tuple[int, ...], None] = {}
    for nodes in subtrees:
        for path, _ in nodes:
            seen.setdefault(path)
            if len(seen) == limit:
                return list(seen)
    return list(seen)


def _first_path(paths: list[tuple[int, ...]]) -> list[int]:
    """The tokens of :func:`_layout`'s first root-to-leaf path (each node's first child in priority order),
    without laying the tree out."""
    first: dict[tuple[int, ...], tuple[int, ...]] = {}
    for path in paths:
        first.setdefault(path[:-1], path)
    out: list[int] = []
    node: tuple[int, ...] = ()
    while node in first:
        node = first[node]
        out.append(node[-1])
    return out


def _layout(root: int, paths: list[tuple[int, ...]]) -> DraftTree:
    """Depth-first layout of a prefix-closed node set; siblings keep their priority order."""
    return DraftTree.from_paths(root, paths)
