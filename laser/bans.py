"""Bad words as one index per word list: the tokens a request may not emit next, in a few dict look-ups.

A bad word is a token sequence: a one-token word is always banned; a longer one bans its last token where
the text ends with the others (``generate``'s ``bad_words_ids``; vLLM's ``bad_words``). Checking every word
at every position costs a Python loop over the words each step. :class:`BanIndex` files the words once by
their prefixes, so a position costs one look-up per prefix length (at most the longest word's), whatever
the number of words; the engines then set every banned (position, token) to -inf in one tensor operation
(:func:`mask_banned`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch


class BanIndex:
    """``words`` (token sequences) filed by prefix: :meth:`banned` gives the tokens banned after a text."""

    def __init__(self, words: Iterable[Sequence[int]]) -> None:
        after: dict[tuple[int, ...], set[int]] = {}
        always: set[int] = set()
        for word in words:
            if not word:
                continue
            if len(word) == 1:
                always.add(int(word[0]))
            else:
                after.setdefault(tuple(int(t) for t in word[:-1]), set()).add(int(word[-1]))
        self.always = frozenset(always)
        self.after = {k: frozenset(v) for k, v in after.items()}
        self.lengths = sorted({len(k) for k in after})  # the prefix lengths to look up

    def __bool__(self) -> bool:
        return bool(self.always or self.after)

    def banned(self, text: Sequence[int]) -> frozenset[int] | set[int]:
        """The tokens banned right after ``text`` (its end is what counts)."""
        out: frozenset[int] | set[int] = self.always
        for n in self.lengths:
            if n > len(text):
                break
            hit = self.after.get(tuple(text[len(text) - n :]))
            if hit:
                out = out | hit
        return out


@lru_cache(maxsize=4096)
def ban_index(words: tuple[tuple[int, ...], ...]) -> BanIndex:
    """The index of a word list, built once per distinct list (requests of one entity kind share theirs)."""
    return BanIndex(words)


def mask_banned(logits: torch.Tensor, banned: Iterable[tuple[int, Iterable[int]]]) -> None:
    """Set ``logits[row, token]`` to -inf for every ``(row, tokens)`` of ``banned``, in one tensor operation
    (tokens outside the vocabulary are ignored)."""
    rows: list[int] = []
    tokens: list[int] = []
    vocab = logits.shape[-1]
    for row, toks in banned:
        for t in toks:
            if 0 <= t < vocab:
                rows.append(row)
                tokens.append(t)
    if rows:
        idx = torch.tensor(rows, device=logits.device), torch.tensor(tokens, device=logits.device)
        logits.index_put_(idx, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))
