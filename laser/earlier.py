"""An entity's own earlier text as its first draft source.

On a refresh the likeliest draft of an entity's new knowledge is its own earlier knowledge: a profile
rewritten after one more interaction keeps most of its sentences. :class:`EarlierFirst` wraps a
request's draft source (its group's pool, prompt lookup, or none): each step it looks up the context's
longest suffix (``n_max`` tokens down to ``MIN_MATCH``) in the earlier text, from where the last match
left off, and drafts what followed it there first; a one-token suffix counts only where the text is
followed in step (the new text went on as the earlier one did). The wrapped drafter fills the rest of
the tree (or the whole draft when the earlier text has no match). It counts the draft tokens the target accepted from the
earlier text (``own_accepted``: accepted tokens that followed the earlier text's branch) for the report.
"""

from __future__ import annotations

from typing import Sequence

import torch

from laser.drafting import DraftSource, Drafter
from laser.own_text import OwnText
from laser.tree import DraftTree

CHAIN = 8  # earlier-text draft tokens when the caller sets no budget
MIN_MATCH = 2  # shortest suffix looked up anywhere in the earlier text (a single token matches too often)


class EarlierFirst:
    """A draft source that drafts from ``earlier`` (token ids) first, then from ``inner`` (may be None)."""

    def __init__(self, earlier: Sequence[int], inner: DraftSource | None = None) -> None:
        self.earlier, self.inner = list(earlier), inner

    def open(self, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float = 0.0) -> Drafter:
        inner = self.inner.open(prompt_ids, max_nodes, n_max, min_prob) if self.inner is not None else None
        return EarlierFirstDrafter(self.earlier, inner, n_max, max_nodes)


def with_earlier(source: DraftSource | None, earlier: Sequence[int] | None) -> DraftSource | None:
    """``source`` with the entity's earlier text drafted first, when it has one."""
    return EarlierFirst(earlier, source) if earlier else source


class EarlierFirstDrafter(Drafter):
    """Per-request drafter: the earlier text's continuation first, the wrapped drafter's tree after it."""

    def __init__(self, earlier: Sequence[int], inner: Drafter | None, n_max: int, max_nodes: int) -> None:
        self.text = OwnText(max(2, n_max + 1), earlier, longest=max(1, n_max))
        self.inner, self.n_max, self.max_nodes = inner, max(1, n_max), max_nodes
        self.needs_hidden = bool(inner is not None and inner.needs_hidden)
        self.cursor = 0  # where the last match's continuation began: the text is read forward from there
        self.expect = -1  # where the earlier text stands if the new text followed it since the last match
        self.chain: list[int] = []  # the earlier-text draft of the last proposal
        self.own_accepted = 0
        self._match: tuple[int, int, list[int]] | None = None  # (context length, suffix matched, its ends)

    def _continuation(self, context: Sequence[int], limit: int) -> list[int]:
        """What followed the context's longest suffix in the earlier text (the first occurrence at or after
        the cursor, else the last one), up to ``limit`` tokens."""
        n, ends = self._suffix(context)
        if 0 < n < MIN_MATCH:  # a single token: only where the new text is following the earlier one
            ends = [self.expect] if self._in_step(context) else []
        if not ends:
            return []
        end = next((e for e in ends if e >= self.cursor), ends[-1])
        self.cursor = self.expect = end
        return self.text.tokens[end : end + limit]

    def _suffix(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """The context's suffix match in the earlier text, once per context (a step asks for the match
        length, then for the draft, of the same context)."""
        if self._match is None or self._match[0] != len(context):
            self._match = (len(context), *self.text.suffix_match(context, self.n_max))
        return self._match[1], self._match[2]

    def _in_step(self, context: Sequence[int]) -> bool:
        """Whether the new text's last token is the one the earlier text has where it is being followed."""
        return 0 < self.expect < len(self.text) and self.text.tokens[self.expect - 1] == context[-1]

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        limit = self.max_nodes if budget is None else budget
        self.chain = self._continuation(context, min(limit, CHAIN if budget is None else limit))
        own = [tuple(self.chain[: i + 1]) for i in range(len(self.chain))]
        rest = (
            self.inner.propose(context, max(0, limit - len(own))).paths()
            if self.inner is not None and limit > len(own)
            else []
        )
        paths = list(dict.fromkeys(own + rest))[: max(limit, len(own))]
        return DraftTree.from_paths(context[-1], paths)

    def propose_chain(self, context: Sequence[int], budget: int | None = None) -> list[int]:
        self.chain = self._continuation(context, CHAIN if budget is None else budget)
        if self.chain or self.inner is None:
            return self.chain
        return self.inner.propose_chain(context, budget)

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        # accepted drafts are new_tokens[:-1] (the last is the target's own token)
        n = 0
        while n < min(len(self.chain), len(new_tokens) - 1) and self.chain[n] == new_tokens[n]:
            n += 1
        self.own_accepted += n
        self.expect = self.expect + len(new_tokens) if n == len(new_tokens) - 1 and self.chain else -1
        self.chain = []
        if self.inner is not None:
            self.inner.commit(new_tokens, hidden)

    def match_length(self, context: Sequence[int]) -> int | None:
        own = self._suffix(context)[0]
        if own < MIN_MATCH and not self._in_step(context):
            own = 0
        theirs = self.inner.match_length(context) if self.inner is not None else None
        return max(own, theirs or 0)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
