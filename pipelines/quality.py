"""Text-quality figures of generated knowledge: finished by EOS, repetition, degenerate flag.

Rules (documented in README, "Knowledge quality"):

- **words**: lower-cased runs of letters/digits/apostrophes (``\\w+(?:'\\w+)*``); punctuation is ignored.
- **repeat_4gram**: the share of the text's word 4-grams that already occurred earlier in the same text
  (0.0 for a text of fewer than 4 words). Ordinary prose scores near 0; a looping text ("a dark
  underbelly with a dark underbelly with ...") approaches 1.
- **degenerate**: fewer than ``MIN_WORDS`` words, or ``repeat_4gram >= MAX_REPEAT_4GRAM``.

:func:`text_quality` scores one text; :func:`summarise_quality` aggregates texts (the job's closing
summary and the benchmarks use it per decoder).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Literal

NGRAM = 4
MAX_REPEAT_4GRAM = 0.2  # at least a fifth of the 4-grams are repeats: the text loops
MIN_WORDS = 3
DegeneratePolicy = Literal["keep", "retry_greedy", "fail"]
GREEDY_RETRY_DECODER = "autoregressive"
_WORD = re.compile(r"\w+(?:'\w+)*")


def words(text: str) -> list[str]:
    """The text's words, lower-cased (see the module docstring)."""
    return _WORD.findall(text.lower())


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """Share of the word ``n``-grams of ``text`` that repeat an earlier one (0.0 with fewer than n words)."""
    ws = words(text)
    grams = [tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


@dataclass(frozen=True)
class TextQuality:
    """The quality fields of one knowledge row."""

    finished_eos: bool
    repeat_4gram: float
    degenerate: bool

    def reason(self) -> str:
        """Why the text is degenerate (for failure records and logs)."""
        return (f"degenerate text: {self.repeat_4gram:.0%} of its word 4-grams repeat "
                f"(limit {MAX_REPEAT_4GRAM:.0%}) or it has fewer than {MIN_WORDS} words")


def text_quality(text: str, finish_reason: str) -> TextQuality:
    """Score one generated text; ``finish_reason`` is the decoder's (``eos`` or ``length``)."""
    rep = repeated_ngram_share(text)
    return TextQuality(finished_eos=finish_reason == "eos", repeat_4gram=round(rep, 4),
                       degenerate=len(words(text)) < MIN_WORDS or rep >= MAX_REPEAT_4GRAM)


@dataclass
class QualitySummary:
    """Quality over many texts: counts and the mean repeat share."""

    n: int = 0
    finished_eos: int = 0
    degenerate: int = 0
    repeat_4gram_sum: float = 0.0

    def add(self, q: TextQuality) -> None:
        self.n += 1
        self.finished_eos += q.finished_eos
        self.degenerate += q.degenerate
        self.repeat_4gram_sum += q.repeat_4gram

    @property
    def eos_share(self) -> float:
        return self.finished_eos / self.n if self.n else 0.0

    @property
    def mean_repeat_4gram(self) -> float:
        return self.repeat_4gram_sum / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "finished_eos": self.finished_eos, "eos_share": round(self.eos_share, 4),
                "degenerate": self.degenerate, "mean_repeat_4gram": round(self.mean_repeat_4gram, 4)}


def summarise_quality(texts: Iterable[str], finish_reasons: Iterable[str]) -> QualitySummary:
    """Quality of a set of generations (e.g. one decoder's outputs in a benchmark)."""
    out = QualitySummary()
    for text, reason in zip(texts, finish_reasons, strict=True):
        out.add(text_quality(text, reason))
    return out
