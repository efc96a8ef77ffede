"""Text-quality figures of generated knowledge: how it ended, repetition, fragments, length and grounding.

Rooms: ``text_shape`` (how a text ended, repeats, fragments, length), ``facts`` (the grounding record),
``movies`` (titles, genres, ratings, years), ``commerce`` (brands, prices), ``scores`` (a row's quality
columns and the quality over many texts).

Rules (documented in docs/knowledge-quality.md):

- **words**: lower-cased runs of letters/digits/apostrophes (``\\w+(?:'\\w+)*``); punctuation is ignored.
- **repeat_4gram**: repeated / all word 4-grams, where a 4-gram is repeated when it already occurred earlier in
  the same text (0.0 for a text of fewer than 4 words), computed as one float division of two counts.
- **degenerate**: fewer than ``MIN_WORDS`` words, or repeated / all >= ``MAX_REPEAT_4GRAM`` compared EXACTLY
  (as fractions): 1 repeat in 5 4-grams is degenerate, a stored 0.2 always means degenerate.
- **sentence end**: the text, stripped, ends with ``.``, ``!`` or ``?`` (closing quotes/brackets after it allowed).
- **ended**: finished by EOS or a stop string, or it ends at a sentence end (within the budget, which it always is).
- **cut**: stopped at the token limit and not at a sentence end.
- **surely degenerate** (:func:`surely_degenerate`): degenerate now and whatever follows within the token
  limit; the knowledge job stops such a first text early (finish reason ``loop``), as it is retried anyway.
- **fragment**: not at a sentence end, unbalanced brackets or double quotes, or garbage (fewer than
  ``MIN_LETTER_SHARE`` of its non-space characters are letters).
- **length**: ``n_words`` against ``asked_words`` (the prompt's "at most N words"; 0 when unknown).
- **grounding** (:func:`user_grounding`, :func:`item_grounding`): matched / mentioned facts, None when the text
  mentions none; item texts count brands and prices too where the items table has those columns.
"""

from pipelines.quality.commerce import catalogue_brands, money_amounts
from pipelines.quality.facts import Grounding
from pipelines.quality.movies import (
    KNOWN_GENRES,
    entity_genres,
    genre_forms,
    item_grounding,
    unsupported_genres,
    user_grounding,
)
from pipelines.quality.scores import QualitySummary, entity_quality, quality_columns, row_quality, summarise_quality
from pipelines.quality.text_shape import (
    MAX_REPEAT_4GRAM,
    MIN_LETTER_SHARE,
    MIN_WORDS,
    NGRAM,
    TextQuality,
    ends_sentence,
    fragment_reason,
    repeated_ngram_share,
    surely_degenerate,
    text_quality,
    words,
    words_per_token,
)

__all__ = [
    "KNOWN_GENRES",
    "MAX_REPEAT_4GRAM",
    "MIN_LETTER_SHARE",
    "MIN_WORDS",
    "NGRAM",
    "Grounding",
    "QualitySummary",
    "TextQuality",
    "catalogue_brands",
    "ends_sentence",
    "entity_genres",
    "entity_quality",
    "fragment_reason",
    "genre_forms",
    "item_grounding",
    "money_amounts",
    "quality_columns",
    "repeated_ngram_share",
    "row_quality",
    "summarise_quality",
    "surely_degenerate",
    "text_quality",
    "unsupported_genres",
    "user_grounding",
    "words",
    "words_per_token",
]
