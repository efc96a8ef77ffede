"""A token trie with pass counts, on pygtrie.

From every position of a text the window of the next ``window`` tokens is inserted, and every node on
the window's path counts one more pass. A node's count is therefore the number of occurrences of its
token sequence (for sequences no longer than the window), and counts never grow going down a branch:
the most frequent K nodes under any node always form a connected subtree.
"""

from __future__ import annotations

import gc
import heapq
import itertools
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pygtrie


class TokenTrie:
    """Token-id tuples -> pass counts; ``len()`` is the number of nodes (O(1))."""

    def __init__(self, window: int = 13):
        if window < 2:
            raise ValueError(f"trie window must be >= 2 tokens, got {window}")
        self.window = window
        self._trie = pygtrie.Trie()
        self._nodes = 0

    def __len__(self) -> int:
        return self._nodes

    def count(self, key: Sequence[int]) -> int:
        count: int = self._trie.get(tuple(key), 0)
        return count

    def follows(self, key: Sequence[int]) -> bool:
        """Whether some token followed ``key`` (the node has children)."""
        followed: bool = self._trie.has_subtrie(tuple(key))
        return followed

    def extend(self, tokens: Sequence[int], old_len: int = 0) -> None:
        """Count the windows of ``tokens`` that end past ``old_len`` (tokens before it were counted earlier).

        With ``old_len=0`` this inserts a whole text; a growing sequence (prompt, then accepted tokens)
        passes its previous length so that every window is counted exactly once.
        """
        tokens = tuple(tokens)
        for start in range(max(0, old_len - self.window + 1), len(tokens)):
            key = tokens[start : start + self.window]
            self._trie.setdefault(key, 0)
            steps = self._trie.walk_towards(key)
            next(steps)  # the root (empty key)
            for depth, step in enumerate(steps, start=1):
                if start + depth > old_len:
                    old = step.get()  # None or 0 (just set above): a new node
                    self._nodes += not old
                    step.value = (old or 0) + 1

    def top_subtree(
        self, prefix: Sequence[int], limit: int, max_depth: int, min_prob: float = 0.0
    ) -> list[tuple[tuple[int, ...], int]]:
        """The ``limit`` most frequent nodes below ``prefix`` (at most ``max_depth`` deeper), best first.

        ``min_prob`` drops nodes seen in less than that share of the prefix's occurrences (their
        empirical probability of following it); since counts only shrink going down, this cuts the
        tail of the same best-first order. Returns (path relative to the prefix, count) pairs; each
        node comes after its parent. Best-first expansion visits only the chosen nodes and their children.
        """
        try:
            root = self._trie.traverse(_lazy_node, prefix=tuple(prefix))
        except KeyError:
            return []
        heap: list[tuple[int, int, tuple[int, ...], Iterable[_Node]]] = []  # (-count, tie, path, children)
        tie = itertools.count()  # equal counts: the earlier-inserted child first

        def push(children: Iterable[_Node]) -> None:
            for path, count, grandchildren in children:
                heapq.heappush(heap, (-(count or 0), next(tie), tuple(path[len(prefix) :]), grandchildren))

        push(root[2])
        floor = min_prob * (root[1] or 0)
        out: list[tuple[tuple[int, ...], int]] = []
        while heap and len(out) < limit and -heap[0][0] >= floor:
            neg_count, _, path, children = heapq.heappop(heap)
            out.append((path, -neg_count))
            if len(path) < max_depth:
                push(children)
        return out

    def evict(self, max_nodes: int) -> None:
        """Least-frequently-used eviction with halving: drop nodes passed at most once, halve the rest."""
        if self._nodes <= max_nodes:
            return
        rare = [key for key, count in self._trie.iteritems() if count <= 1 and self._trie.get(key[:-1], 2) > 1]
        for key in rare:
            del self._trie[key:]
        self._nodes = 0
        for key, count in list(self._trie.iteritems()):
            self._trie[key] = count // 2
            self._nodes += 1

    def to_state(self) -> np.ndarray:
        """The trie as plain integers: pygtrie's own node encoding (navigation commands, token steps and
        counts, depth-first; see ``pygtrie._Node.__getstate__``), which is what pickling it stores."""
        return np.asarray(self._trie._root.__getstate__(), dtype=np.int64)

    @classmethod
    def from_state(cls, window: int, nodes: int, state: Sequence[int]) -> "TokenTrie":
        """The trie :meth:`to_state` encoded (plain integers: nothing here can run code)."""
        trie = cls(window)
        root = pygtrie._Node()
        with paused_gc():
            root.__setstate__(list(state))
        trie._trie._root = root
        trie._nodes = nodes
        return trie


_Node = tuple[tuple[int, ...], "int | None", Iterable[Any]]  # (path, count, children) as _lazy_node makes


def _lazy_node(path_conv: Any, path: tuple[int, ...], children: Iterable[Any], value: int | None = None) -> _Node:
    # pygtrie.traverse callback: the children iterator stays unconsumed until the node is expanded.
    return path, value, children


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of trie nodes are created or unpickled.

    Trie nodes form no reference cycles, but every allocation burst triggers full collections that
    walk all of them: pausing makes building and loading a large pool several times faster.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
