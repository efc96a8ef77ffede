"""How a generated text is shaped: how it ended, repetition, fragments and length (rules: the package docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from pipelines.quality.facts import Grounding

NGRAM = 4
MAX_REPEAT_4GRAM = 0.2  # at least a fifth of the 4-grams are repeats: the text loops
_MAX_REPEAT = Fraction(1, 5)  # the same threshold, compared exactly
MIN_WORDS = 3
MIN_LETTER_SHARE = 0.6
_WORD = re.compile(r"\w+(?:'\w+)*")
_CLOSERS = "\"'”’)]"  # what may follow a sentence's final mark


def words(text: str) -> list[str]:
    """The text's words, lower-cased (see the module docstring)."""
    return _WORD.findall(text.lower())


def _repeat_counts(text: str, n: int = NGRAM) -> tuple[int, int]:
    """(repeated, all) word ``n``-grams of ``text``."""
    return _word_repeats(words(text), n)


def _word_repeats(ws: Sequence[str], n: int = NGRAM) -> tuple[int, int]:
    total = max(0, len(ws) - n + 1)
    return total - len(set(zip(*(ws[i:] for i in range(n))))), total


def surely_degenerate(text: str, more_words: int) -> bool:
    """Whether ``text`` followed by anything of at most ``more_words`` words is degenerate (its loop can no
    longer be outgrown).

    The text's last word may still grow, so it is set aside: the 4-grams of the other words are the first
    4-grams of every continuation and their repeats stay repeats, while a continuation has at most
    ``kept + 1 + more_words`` words. The text itself is then degenerate too.
    """
    kept = words(text)[:-1]
    repeated, _ = _word_repeats(kept)
    most = len(kept) + 1 + more_words - (NGRAM - 1)
    return repeated > 0 and Fraction(repeated, most) >= _MAX_REPEAT


def words_per_token(tokenizer) -> int:
    """The most words one token can add to a text: the most any vocabulary entry's text holds, at least 1
    (a word split over tokens starts in one of them)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return max(1, max(len(_WORD.findall(t)) for t in texts))


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """Share of the word ``n``-grams of ``text`` that repeat an earlier one (0.0 with fewer than n words)."""
    rep, total = _repeat_counts(text, n)
    return rep / total if total else 0.0


def ends_sentence(text: str) -> bool:
    """The stripped text ends with sentence-final punctuation (closing quotes/brackets allowed after it)."""
    return text.strip().rstrip(_CLOSERS).endswith((".", "!", "?"))


def fragment_reason(text: str) -> str | None:
    """Why ``text`` reads as a fragment or garbage (module docstring), or None."""
    body = text.strip()
    if not ends_sentence(body):
        return "does not end at a sentence end"
    pairs = (("(", ")"), ("[", "]"))
    if any(body.count(a) != body.count(b) for a, b in pairs) or body.count('"') % 2:
        return "unbalanced brackets or quotes"
    letters, visible = _letter_counts(body)
    if visible and letters / visible < MIN_LETTER_SHARE:
        return f"fewer than {MIN_LETTER_SHARE:.0%} of its characters are letters"
    return None


_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())  # \x1c-\x1f too, as str.isspace has them
_ASCII_LETTERS = bytes(c for c in range(128) if chr(c).isalpha())


def _letter_counts(text: str) -> tuple[int, int]:
    """(letters, non-space characters) of ``text`` as ``str.isalpha`` / ``str.isspace`` count them; an ASCII
    text is counted by two byte deletions (C speed), any other character by character."""
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw) - len(raw.translate(None, _ASCII_LETTERS)), len(raw.translate(None, _ASCII_SPACE))
    return sum(map(str.isalpha, text)), len(text) - sum(map(str.isspace, text))


@dataclass(frozen=True)
class TextQuality:
    """The quality fields of one knowledge row (grounding None: not measured or nothing mentioned)."""

    finished_eos: bool
    repeat_4gram: float
    degenerate: bool
    ended: bool | None = None
    cut: bool | None = None
    fragment: bool | None = None
    n_words: int | None = None
    asked_words: int | None = None
    grounding: "Grounding | None" = None

    @property
    def flawed(self) -> bool:
        """Degenerate, cut or a fragment: what the retry policy regenerates."""
        return bool(self.degenerate or self.cut or self.fragment)

    def reason(self) -> str:
        """Why the text is flawed (for failure records and logs)."""
        if self.degenerate:
            return (
                f"degenerate text: {self.repeat_4gram:.0%} of its word 4-grams repeat "
                f"(limit {MAX_REPEAT_4GRAM:.0%}) or it has fewer than {MIN_WORDS} words"
            )
        if self.cut:
            return "cut text: stopped at the token limit mid-sentence"
        return "fragment: does not end at a sentence end, unbalanced brackets/quotes or few letters"


def text_quality(
    text: str, finish_reason: str, asked_words: int | None = None, grounding: "Grounding | None" = None
) -> TextQuality:
    """Score one generated text; ``finish_reason`` is the decoder's (``eos`` or ``length``)."""
    ws = words(text)
    rep, total = _word_repeats(ws)
    n_words = len(ws)
    at_end = ends_sentence(text)
    loops = total > 0 and rep * _MAX_REPEAT.denominator >= _MAX_REPEAT.numerator * total  # rep/total >= 1/5, exact
    return TextQuality(
        finished_eos=finish_reason == "eos",
        repeat_4gram=rep / total if total else 0.0,
        degenerate=n_words < MIN_WORDS or loops,
        ended=finish_reason in ("eos", "stop") or at_end,
        cut=finish_reason == "length" and not at_end,
        fragment=fragment_reason(text) is not None,
        n_words=n_words,
        asked_words=asked_words,
        grounding=grounding,
    )
