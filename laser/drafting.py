"""What the decoding core needs from a draft source.

A *draft source* (e.g. a retrieval pool) opens one *drafter* per request; the drafter owns all
per-request state (for a trie pool: the temporary branches of the prompt and of the text generated so
far) and is closed when the request ends.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from laser.tree import DraftTree


class Drafter(Protocol):
    def propose(self, context: Sequence[int]) -> DraftTree:
        """A draft tree rooted at ``context[-1]`` (the last token, not yet in the KV cache)."""

    def commit(self, new_tokens: Sequence[int]) -> None:
        """Tokens appended to the context by the last step (accepted drafts + the correction/bonus)."""

    def close(self) -> None:
        """The request ended: drop its per-request state."""


class DraftSource(Protocol):
    def open(self, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float) -> Drafter:
        """A drafter for one request whose prompt is ``prompt_ids``.

        Trees hold at most ``max_nodes`` drafts, found from prefixes of at most ``n_max`` tokens, each
        having followed its prefix in at least ``min_prob`` of the prefix's occurrences.
        """


class NoDrafter:
    """Proposes the root alone: one token per step (autoregressive decoding on the same code path)."""

    def propose(self, context: Sequence[int]) -> DraftTree:
        return DraftTree.chain(context[-1])

    def commit(self, new_tokens: Sequence[int]) -> None:
        pass

    def close(self) -> None:
        pass
