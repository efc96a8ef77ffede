"""A request's own text (prompt, then what it generated) as an n-gram index: its *temporary* branches.

It answers what a token trie of the text (``pools.trie.TokenTrie``: windows of ``window`` tokens from
every position) answers: counts of token sequences and the most frequent continuations of a prefix,
ties broken by first occurrence. It pays a few dict appends per new token instead of a trie walk per
window: every engine step feeds every row its new tokens, so this is on the hot path. It also answers
prompt lookup (:meth:`OwnText.latest_follow`).

Each n-gram up to ``longest`` tokens (the longest prefix retrieval asks about, e.g. ``n_max``) maps to
the end positions of its occurrences, in order; a longer key is found by checking the occurrences of its
last ``longest`` tokens. The continuations of a prefix are read off the text at those positions.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence


class OwnText:
    """One growing token sequence indexed by its n-grams (n from 1 to ``longest``, at most ``window``)."""

    def __init__(self, window: int = 13, tokens: Sequence[int] = (), longest: int | None = None):
        if window < 2:
            raise ValueError(f"n-gram window must be >= 2 tokens, got {window}")
        self.window = window
        self.longest = max(1, min(window, longest or window))
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> end positions (exclusive), ascending
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens; every n-gram that ends in them is indexed once."""
        text, ends, longest = self.tokens, self._ends, self.longest
        for token in new_tokens:
            text.append(int(token))
            end = len(text)
            for n in range(1, min(longest, end) + 1):
                key = tuple(text[end - n : end])
                found = ends.get(key)
                if found is None:
                    ends[key] = [end]
                else:
                    found.append(end)

    def ends(self, key: Sequence[int]) -> list[int]:
        """End positions (exclusive) of the occurrences of ``key``, ascending; none for a key longer than
        the window (as in the trie)."""
        key = tuple(key)
        if len(key) <= self.longest:
            return self._ends.get(key, [])
        if len(key) > self.window:
            return []
        text, n = self.tokens, len(key)
        return [
            end for end in self._ends.get(key[-self.longest :], []) if end >= n and tuple(text[end - n : end]) == key
        ]

    def count(self, key: Sequence[int]) -> int:
        """Occurrences of ``key`` in the text."""
        return len(self.ends(key))

    def follows(self, key: Sequence[int]) -> bool:
        """Whether some token followed an occurrence of ``key``."""
        ends = self.ends(key)
        return bool(ends) and ends[0] < len(self.tokens) and len(key) < self.window

    def match_length(self, n_max: int) -> int:
        """Tokens (up to ``n_max``) of the text's longest suffix that occurred earlier, with a token after it
        (a suffix that occurred earlier makes every shorter one occur earlier too)."""
        text, n = self.tokens, 0
        while n < min(n_max, len(text) - 1) and len(self.ends(text[-n - 1 :])) > 1:
            n += 1
        return n

    def latest_follow(self, n_max: int, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the text's longest suffix
        (``n_max`` tokens down to 1) that occurred before: prompt lookup."""
        n = self.match_length(n_max)
        if n == 0:
            return []
        start = self.ends(self.tokens[-n:])[-2]  # the last occurrence is the suffix itself
        return self.tokens[start : start + limit]

    def top_subtree(
        self, prefix: Sequence[int], limit: int, max_depth: int, min_prob: float = 0.0
    ) -> list[tuple[tuple[int, ...], int]]:
        """The ``limit`` most frequent continuations below ``prefix``, as ``TokenTrie.top_subtree``.

        A node is a continuation path; its count is how often prefix + path occurs, and no node goes
        deeper than the window. Equal counts: the node whose parent was expanded first, then the one
        whose sequence occurs first.
        """
        prefix = tuple(prefix)
        root = self.ends(prefix)
        if not root:
            return []
        text, room = self.tokens, self.window - len(prefix)  # the window bounds the depth too
        heap: list[tuple[int, int, tuple[int, ...], list[int]]] = []  # (-count, tie, path, ends)
        tie = itertools.count()

        def push(path: tuple[int, ...], ends: list[int]) -> None:
            children: dict[int, list[int]] = {}
            for end in ends:  # group the occurrences by the token that follows, in order of first occurrence
                if end < len(text):
                    children.setdefault(text[end], []).append(end + 1)
            for token, child_ends in children.items():
                heapq.heappush(heap, (-len(child_ends), next(tie), path + (token,), child_ends))

        if room > 0:
            push((), root)
        floor = min_prob * len(root)
        out: list[tuple[tuple[int, ...], int]] = []
        while heap and len(out) < limit and -heap[0][0] >= floor:
            neg_count, _, path, ends = heapq.heappop(heap)
            out.append((path, -neg_count))
            if len(path) < max_depth and len(path) < room:
                push(path, ends)
        return out
