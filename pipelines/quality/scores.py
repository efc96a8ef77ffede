"""A generated text's quality as the knowledge store keeps it (one row's columns), and over many texts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from pipelines.quality.facts import Grounding
from pipelines.quality.movies import item_grounding, user_grounding
from pipelines.quality.text_shape import TextQuality, text_quality


def entity_quality(
    text: str,
    finish_reason: str,
    entity_type: str,
    history: Sequence[tuple] | None = None,
    item: Mapping | None = None,
    asked_words: int | None = None,
    brands: Iterable[str] = (),
) -> TextQuality:
    """:func:`text_quality` with the grounding of a user (``history``) or item (``item``) text; ``brands``:
    the catalogue's (:func:`catalogue_brands`)."""
    if entity_type == "user" and history:
        grounding = user_grounding(text, history)
    elif entity_type == "item" and item:
        grounding = item_grounding(text, item, brands=brands)
    else:
        grounding = None
    return text_quality(text, finish_reason, asked_words, grounding)


def quality_columns(q: TextQuality) -> dict[str, object]:
    """The knowledge-store quality columns of one row (pipelines/store/knowledge.py, ``KnowledgeRow``)."""
    g = q.grounding
    return {
        "finished_eos": q.finished_eos,
        "repeat_4gram": q.repeat_4gram,
        "degenerate": q.degenerate,
        "ended": q.ended,
        "cut": q.cut,
        "fragment": q.fragment,
        "n_words": q.n_words,
        "asked_words": q.asked_words,
        "facts_mentioned": g.n_mentioned if g is not None else None,
        "grounding": g.share if g is not None else None,
    }


def row_quality(row: Mapping) -> TextQuality:
    """The quality of a stored row from its columns (grounding as one aggregate kind, ``facts``)."""
    g = None
    if row.get("facts_mentioned"):
        n = int(row["facts_mentioned"])
        g = Grounding({"facts": n}, {"facts": round((row.get("grounding") or 0.0) * n)})
    return TextQuality(
        row["finished_eos"],
        row["repeat_4gram"],
        row["degenerate"],
        row.get("ended"),
        row.get("cut"),
        row.get("fragment"),
        row.get("n_words"),
        row.get("asked_words"),
        g,
    )


@dataclass
class QualitySummary:
    """Quality over many texts: counts, the mean repeat share, length against the ask and grounding."""

    n: int = 0
    finished_eos: int = 0
    degenerate: int = 0
    repeat_4gram_sum: float = 0.0
    ended: int = 0
    cut: int = 0
    fragment: int = 0
    over_budget: int = 0  # more words than asked
    length_ratio_sum: float = 0.0
    length_ratio_n: int = 0
    mentioned: int = 0
    matched: int = 0
    grounding_by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [matched, mentioned]

    def add(self, q: TextQuality) -> None:
        self.n += 1
        self.finished_eos += bool(q.finished_eos)
        self.degenerate += bool(q.degenerate)
        self.repeat_4gram_sum += q.repeat_4gram or 0.0
        self.ended += bool(q.ended)
        self.cut += bool(q.cut)
        self.fragment += bool(q.fragment)
        if q.asked_words and q.n_words is not None:
            self.over_budget += q.n_words > q.asked_words
            self.length_ratio_sum += q.n_words / q.asked_words
            self.length_ratio_n += 1
        if q.grounding is not None:
            self.mentioned += q.grounding.n_mentioned
            self.matched += q.grounding.n_matched
            for kind, n in q.grounding.mentioned.items():
                slot = self.grounding_by_kind.setdefault(kind, [0, 0])
                slot[0] += q.grounding.matched[kind]
                slot[1] += n

    @property
    def eos_share(self) -> float:
        return self.finished_eos / self.n if self.n else 0.0

    @property
    def mean_repeat_4gram(self) -> float:
        return self.repeat_4gram_sum / self.n if self.n else 0.0

    @property
    def grounding(self) -> float | None:
        """Matched / mentioned facts over all texts (None: nothing mentioned)."""
        return self.matched / self.mentioned if self.mentioned else None

    def as_dict(self) -> dict[str, object]:
        def share(k: int) -> float:
            return round(k / self.n, 4) if self.n else 0.0

        return {
            "n": self.n,
            "finished_eos": self.finished_eos,
            "eos_share": round(self.eos_share, 4),
            "degenerate": self.degenerate,
            "mean_repeat_4gram": round(self.mean_repeat_4gram, 4),
            "ended": self.ended,
            "ended_share": share(self.ended),
            "cut": self.cut,
            "cut_share": share(self.cut),
            "fragment": self.fragment,
            "degenerate_share": share(self.degenerate),
            "over_budget": self.over_budget,
            "mean_length_ratio": round(self.length_ratio_sum / self.length_ratio_n, 4) if self.length_ratio_n else None,
            "facts_mentioned": self.mentioned,
            "facts_matched": self.matched,
            "grounding": round(self.grounding, 4) if self.grounding is not None else None,
            "grounding_by_kind": {
                k: {"matched": m, "mentioned": n} for k, (m, n) in sorted(self.grounding_by_kind.items())
            },
        }


def summarise_quality(texts: Iterable[str], finish_reasons: Iterable[str]) -> QualitySummary:
    """Quality of a set of generations (e.g. one decoder's outputs in a benchmark)."""
    out = QualitySummary()
    for text, reason in zip(texts, finish_reasons, strict=True):
        out.add(text_quality(text, reason))
    return out
