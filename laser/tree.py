"""Draft trees and their tree-attention layout.

A draft tree is a root (the last generated token, whose KV is not cached yet) plus draft nodes, each
with a parent index. Nodes are stored in depth-first order (``parents[i] < i``), so any root-to-node
path is increasing in index and a path made of the first ``m`` nodes is a plain prefix of the layout.
A chain is a tree whose parents are consecutive.

What a verifier may need rides along, each optional:

- ``draft_probs`` ``[N]``  the drafter's probability of each node's token at its parent (root: 1);
- ``draft_dists`` ``[N, V]`` the drafter's full next-token distribution *after* each node (row i is the
  distribution its children were drawn from), as the target's logits row i is;
- ``scores``      ``[N]``  a beam score per node (e.g. cumulative log-probability).

``cached`` nodes at the front of a tree are already in the request's KV cache: beam decoders keep the
beams' shared prefixes from one step to the next (a verifier's ``Outcome.keep``) and lay them out again
as the first nodes of the next tree, so only the new nodes are fed.

None means the drafter is deterministic: rejection sampling then treats each draft as one-hot.

For a batch, trees are padded to the same node count and laid out after each sequence's cached prefix:

- input ids    ``[B, N]``    node tokens (padding repeats the root token)
- position ids ``[B, N]``    prefix length + depth
- 4D mask      ``[B, 1, N, S + N]`` additive: node i sees its sequence's valid cache slots
  (``slot < cache_len``), its ancestors and itself; padding rows see only themselves.

With cached nodes, ``N`` counts fed nodes only: cached node j sits in cache slot ``cache_len + j`` and
is seen there by its descendants; the batch's per-node tensors describe the fed nodes (a parent that is
cached reads -1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class DraftTree:
    """A root token plus draft nodes in depth-first order; ``parents[0] == -1``."""

    tokens: np.ndarray  # [N] int64
    parents: np.ndarray  # [N] int64, -1 for the root
    draft_probs: np.ndarray | None = None  # [N] float, 1 for the root
    draft_dists: torch.Tensor | None = None  # [N, V] next-token distribution after each node
    scores: np.ndarray | None = None  # [N] beam scores
    cached: int = 0  # leading nodes already in the KV cache (kept from the previous step)
    depth: np.ndarray = field(init=False)  # [N] int64, 0 for the root

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64)
        parents = np.asarray(self.parents, dtype=np.int64)
        if tokens.ndim != 1 or tokens.shape != parents.shape or len(tokens) == 0:
            raise ValueError("a draft tree needs equal-length 1-D tokens and parents, root included")
        if parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= np.arange(1, len(parents))):
            raise ValueError(f"parents must be -1 for the root and point to an earlier node: {parents.tolist()}")
        for name in ("draft_probs", "draft_dists", "scores"):
            value = getattr(self, name)
            if value is not None and len(value) != len(tokens):
                raise ValueError(f"{name} has {len(value)} entries for {len(tokens)} nodes")
        if not 0 <= self.cached < len(tokens):
            raise ValueError(f"cached={self.cached}: a tree needs at least one node to feed ({len(tokens)} nodes)")
        depth = np.zeros(len(tokens), dtype=np.int64)
        for i in range(1, len(tokens)):
            depth[i] = depth[parents[i]] + 1
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depth", depth)

    @classmethod
    def chain(cls, root: int, draft: Sequence[int] = (), draft_dists: torch.Tensor | None = None) -> "DraftTree":
        """A single branch: root, draft[0], draft[1], ...; ``draft_dists[i]`` is the distribution draft[i]
        was drawn from (one row per draft token; a row after the last node is not needed)."""
        n = 1 + len(draft)
        probs = dists = None
        if draft_dists is not None:
            if len(draft_dists) != len(draft):
                raise ValueError(f"{len(draft_dists)} draft distributions for {len(draft)} draft tokens")
            # row i of the tree is the distribution after node i: the root's row drew draft[0], and so on
            dists = torch.cat([draft_dists, draft_dists.new_zeros(1, draft_dists.shape[-1])]) if len(draft) else None
            idx = torch.as_tensor(list(draft), dtype=torch.long)
            probs = (
                np.concatenate([[1.0], draft_dists[torch.arange(len(draft)), idx].float().cpu().numpy()])
                if len(draft)
                else None
            )
        return cls(np.array([root, *draft], dtype=np.int64), np.arange(-1, n - 1, dtype=np.int64), probs, dists)

    @classmethod
    def from_paths(cls, root: int, paths: Sequence[tuple[int, ...]]) -> "DraftTree":
        """Depth-first layout of a prefix-closed set of draft paths (token tuples below the root, parents
        before children); siblings keep their order in ``paths`` (priority order)."""
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = {(): []}
        for path in paths:
            children[path[:-1]].append(path)
            children[path] = []
        tokens, parents = [root], [-1]
        stack = [(child, 0) for child in reversed(children[()])]
        while stack:
            path, parent = stack.pop()
            tokens.append(path[-1])
            parents.append(parent)
            here = len(tokens) - 1
            stack.extend((child, here) for child in reversed(children[path]))
        return cls(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))

    def paths(self) -> list[tuple[int, ...]]:
        """Every draft node as its token path below the root, in layout order (the inverse of
        :meth:`from_paths`)."""
        out: list[tuple[int, ...]] = [()]
        for i in range(1, len(self.tokens)):
            out.append(out[self.parents[i]] + (int(self.tokens[i]),))
        return out[1:]

    @property
    def is_chain(self) -> bool:
        return bool(np.all(self.parents == np.arange(-1, len(self.parents) - 1)))

    def children(self) -> list[list[int]]:
        """Child node indices of every node, in depth-first (priority) order."""
        out: list[list[int]] = [[] for _ in range(len(self.tokens))]
        for i in range(1, len(self.tokens)):
            out[self.parents[i]].append(i)
        return out

    def __len__(self) -> int:
        return len(self.tokens)

    def ancestor_mask(self) -> np.ndarray:
        """``[N, N]`` bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        mask = np.eye(n, dtype=bool)
        for i in range(1, n):
            mask[i] |= mask[self.parents[i]]
        return mask

    def first_path(self) -> list[int]:
        """Draft tokens of the first root-to-leaf path (nodes 1, 2, ... while each is its predecessor's
        child): the best chain of a depth-first tree laid out best child first."""
        n = 1
        while n < len(self.parents) and self.parents[n] == n - 1:
            n += 1
        path: list[int] = self.tokens[1:n].tolist()
        return path

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(int(self.parents[path[-1]]))
        return path[::-1]


@dataclass
class TreeBatch:
    """Padded tensors for one target forward over a batch of draft trees."""

    input_ids: torch.Tensor  # [B, N]
    position_ids: torch.Tensor  # [B, N]
    attention_mask: torch.Tensor  # [B, 1, N, S + N] additive
    ancestors: torch.Tensor  # [B, N, N] bool, padding rows see only themselves
    tokens: torch.Tensor  # [B, N] node tokens (padding: -1, never a vocabulary id)
    parents: torch.Tensor  # [B, N] (root and padding: -1)
    depth: torch.Tensor  # [B, N] (padding: -1)
    node_valid: torch.Tensor  # [B, N] bool
    trees: Sequence[DraftTree] = ()  # the trees themselves, for verifiers that read per-node extras


def pack_trees(
    trees: Sequence[DraftTree],
    cache_lens: Sequence[int],
    cache_slots: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> TreeBatch:
    """Lay out ``trees`` after caches holding ``cache_lens`` valid slots (of ``cache_slots`` in all); a tree's
    ``cached`` nodes are read from slots ``cache_len + j`` and not fed again."""
    b, n = len(trees), max(len(t) - t.cached for t in trees)
    tokens = np.full((b, n), -1, dtype=np.int64)
    depth = np.full((b, n), -1, dtype=np.int64)
    parents = np.full((b, n), -1, dtype=np.int64)
    ancestors = np.broadcast_to(np.eye(n, dtype=bool), (b, n, n)).copy()
    lens = np.asarray(cache_lens, dtype=np.int64)
    prefix_seen = np.arange(cache_slots)[None, :] < lens[:, None]  # [B, S]
    seen_cache = np.broadcast_to(prefix_seen[:, None, :], (b, n, cache_slots)).copy()
    for row, tree in enumerate(trees):
        c, m = tree.cached, len(tree) - tree.cached
        tokens[row, :m], depth[row, :m] = tree.tokens[c:], tree.depth[c:]
        parents[row, :m] = np.maximum(tree.parents[c:] - c, -1)
        anc = tree.ancestor_mask()
        ancestors[row, :m, :m] = anc[c:, c:]
        if c:  # cached ancestors sit in the cache right after the request's prefix
            seen_cache[row, :m, lens[row] : lens[row] + c] = anc[c:, :c]
    valid = tokens >= 0
    input_ids = np.where(valid, tokens, tokens[:, :1])
    positions = np.where(valid, lens[:, None] + depth, lens[:, None])
    seen = np.concatenate([seen_cache & valid[:, :, None], ancestors], axis=2)

    def as_tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return TreeBatch(
        input_ids=as_tensor(input_ids),
        position_ids=as_tensor(positions),
        attention_mask=additive_mask(as_tensor(seen)[:, None], dtype),
        ancestors=as_tensor(ancestors),
        tokens=as_tensor(tokens),
        parents=as_tensor(parents),
        depth=as_tensor(depth),
        node_valid=as_tensor(valid),
        trees=trees,
    )


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool "may attend" -> additive mask: 0 where seen, the dtype's most negative value elsewhere."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, torch.finfo(dtype).min)
