"""Versioned knowledge prompts (user preference profiles, item descriptions) in the spirit of KAR.

Each function returns the text of ONE user chat message; the decoder applies the model's chat template.
Variants are picked by ``Dataset.domain`` ("movie" or "book"). Bump ``PROMPT_VERSION`` whenever any
wording changes: it is written next to every knowledge row, and old knowledge from another version
makes a weaker draft pool.

History truncation rule (``user_prompt`` with a tokenizer and ``max_prompt_tokens``): entries are kept
oldest to newest; while the rendered prompt is longer than ``max_prompt_tokens`` tokens, the OLDEST
entry is dropped, so the kept entries are always the newest suffix of the history. The length counted is
the full chat-templated prompt (system text, role markers, generation prompt) when the tokenizer has a
chat template, otherwise the message text alone (``tokenizer.encode(text)``). If not even the newest
entry fits, a ``PromptTooLongError`` names the user.

Entity fields (titles, genres, categories) reach the model as text, never as control tokens: a
tokenizer turns the exact text of its special tokens (``<|im_end|>``, ``</s>``, ``[INST]``) into their
ids wherever it appears, so :func:`as_text` breaks any such marker in a field with a space after its
opening bracket (``< |im_end|>``) before the field enters a prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from pipelines.workers import GenerationRequest, HistoryEntry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pipelines.knowledge.records import DecodeTask

ItemRow = Mapping[str, Any]  # a row of the items table as polars names it: item_id, title, year, genres, ...

PROMPT_VERSION = "kar-v5"  # v5: facts as fields (title, year, genres, rating apart), short answers with headroom
MAX_WORDS = 120
TOKENS_PER_WORD = 1.6  # measured 1.56 on SmolLM2 profile-like prose with quoted titles (101 words, 158 tokens)
HEADROOM = 0.6  # ask for this share of what the budget holds: small models overshoot a requested length
HISTORY_GENRES = 2  # genres shown per history entry


class PromptTooLongError(ValueError):
    """Raised when a prompt cannot fit ``max_prompt_tokens`` even with one history entry."""


_USER_INTRO = {
    "movie": "A user's movie ratings, oldest first (rating 1 = disliked, 5 = loved):",
    "book": "A user's book ratings, oldest first (rating 1 = disliked, 5 = loved):",
}
# Facts go in as fields, one entity per line, so a small model does not mix titles, genres and ratings up;
# the answer is asked short (HEADROOM) and bounded to the listed facts, so it ends within the budget.
# The fixed opening keeps SmolLM2-135M-Instruct from copying the list back instead of profiling it.
_USER_ASK = {
    "movie": (
        "In 2 or 3 short sentences (at most {w} words in all), describe this user's movie taste: the "
        "genres and eras they like and the ones they dislike. Use only the facts listed above. "
        'Begin with "This user enjoys".'
    ),
    "book": (
        "In 2 or 3 short sentences (at most {w} words in all), describe this user's reading taste: the "
        "genres and eras they like and the ones they dislike. Use only the facts listed above. "
        'Begin with "This user enjoys".'
    ),
}
_ITEM_INTRO = {"movie": "A movie:", "book": "A book:"}
_ITEM_ASK = {
    "movie": (
        "In 1 or 2 sentences (at most {w} words in all), say what kind of movie this is and who would "
        "enjoy it, using only its genres and year above."
    ),
    "book": (
        "In 1 or 2 sentences (at most {w} words in all), say what kind of book this is and who would "
        "enjoy it, using only its genres and year above."
    ),
}
_TITLE_YEAR = re.compile(r"^(.*) \((\d{4})\)$")
# the opening bracket of what tokenizers spell control tokens in: <|...|> (ChatML, Llama 3), <name> and
# </name> (<s>, <unk>, <start_of_turn>, <filename>), [INST] / [/INST] and other [UPPER_CASE] markers (Mistral)
_CONTROL_OPENING = re.compile(r"<(?=\|)|<(?=/?[A-Za-z_][\w.-]*>)|\[(?=/?[A-Z][A-Z_]{2,}\])")


def as_text(value: object) -> str:
    """``value`` as prompt text that no tokenizer reads as a control token (module docstring)."""
    return _CONTROL_OPENING.sub(lambda m: m.group(0) + " ", str(value))


def check_domain(domain: str) -> None:
    """A prompt domain this module writes prompts for (``movie``, ...), else ValueError naming the known ones."""
    if domain not in _USER_ASK:
        raise ValueError(f"unknown prompt domain {domain!r}; expected one of {sorted(_USER_ASK)}")


def display_title(title: str, year: int | None = None) -> str:
    """``Title (1995)`` when the year is known, else the title."""
    return f"{title} ({year})" if year is not None else title


def format_rating(rating: float) -> str:
    """``4 stars``, ``4.5 stars``, ``1 star``."""
    value = f"{rating:g}"
    return f"{value} star" if value == "1" else f"{value} stars"


def words_for_budget(max_new_tokens: int) -> int:
    """The word count a prompt may ask for within ``max_new_tokens``: ``MAX_WORDS``, or fewer so that
    words x ``TOKENS_PER_WORD`` fit ``HEADROOM`` of the budget (rounded down to tens, at least 10)."""
    fit = int(max_new_tokens * HEADROOM / TOKENS_PER_WORD) // 10 * 10
    return max(10, min(MAX_WORDS, fit))


def split_year(title: str) -> tuple[str, str | None]:
    """``("Heat", "1995")`` for ``"Heat (1995)"``; the title and None without a trailing year."""
    m = _TITLE_YEAR.match(title)
    return (m.group(1), m.group(2)) if m else (title, None)


def history_line(k: int, e: HistoryEntry) -> str:
    """``3. Title: Heat | Year: 1995 | Genres: Action, Crime | Rating: 4``: one rated item as fields."""
    title, year = split_year(e.title)
    fields = (
        [f"Title: {as_text(title)}"]
        + ([f"Year: {year}"] if year else [])
        + ([f"Genres: {', '.join(as_text(g) for g in e.genres)}"] if e.genres else [])
        + [f"Rating: {e.rating:g}"]
    )
    return f"{k}. " + " | ".join(fields)


def _render_user(entries: Sequence[HistoryEntry], domain: str, max_words: int = MAX_WORDS) -> str:
    lines = [history_line(k, e) for k, e in enumerate(entries, 1)]
    return "\n".join([_USER_INTRO[domain], *lines, "", _USER_ASK[domain].format(w=max_words)])


def count_prompt_tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    """Tokens of ``text`` as the engines prompt it (:func:`laser.models.chat_ids`: one chat-templated user
    message, or the plain text for a tokenizer without a chat template)."""
    from laser.models import chat_ids

    return len(chat_ids(tokenizer, text))


def user_prompt(
    history: Sequence[HistoryEntry | tuple[str, float]],
    domain: str = "movie",
    *,
    user_id: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    max_prompt_tokens: int | None = None,
    max_words: int = MAX_WORDS,
) -> str:
    """The preference-analysis message for a history ordered oldest first.

    With ``tokenizer`` and ``max_prompt_tokens`` the oldest entries are dropped until the prompt fits
    (module docstring); ``user_id`` only names the user in errors.
    """
    check_domain(domain)
    entries = [HistoryEntry(*e) for e in history]
    who = f"user {user_id!r}" if user_id is not None else "user"
    if not entries:
        raise ValueError(f"{who} has an empty history; a preference prompt needs at least one entry")
    if tokenizer is None or max_prompt_tokens is None:
        return _render_user(entries, domain, max_words)

    def fits(keep: int) -> bool:
        return count_prompt_tokens(tokenizer, _render_user(entries[-keep:], domain, max_words)) <= max_prompt_tokens

    if not fits(1):
        raise PromptTooLongError(
            f"{who}: even the newest history entry {entries[-1].title!r} does not fit "
            f"max_prompt_tokens={max_prompt_tokens}"
        )
    lo, hi = 1, len(entries)  # invariant: fits(lo); token count grows with the number of entries kept
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return _render_user(entries[-lo:], domain, max_words)


def _attributes(item: ItemRow) -> list[str]:
    """The item's fields after the title: year, genres, then category/sub-category not among the genres."""
    parts = [f"Year: {as_text(item['year'])}"] if item.get("year") else []
    genres = item.get("genres")
    if genres:
        parts.append("Genres: " + ", ".join(as_text(g) for g in genres))
    for key in ("category", "sub_category"):
        value = item.get(key)
        if value and not (genres and value in genres):
            parts.append(f"{key.replace('_', '-').capitalize()}: {as_text(value)}")
    return parts


def item_prompt(item: ItemRow, domain: str = "movie", max_words: int = MAX_WORDS) -> str:
    """The description message for one item row (``title`` required; ``year``, ``genres``,
    ``category``, ``sub_category`` used when present), its facts one field a line."""
    check_domain(domain)
    title = item.get("title")
    if not title:
        raise ValueError(f"item {item.get('item_id')!r} has no title; an item prompt needs one")
    return "\n".join(
        [_ITEM_INTRO[domain], f"Title: {as_text(title)}", *_attributes(item), "", _ITEM_ASK[domain].format(w=max_words)]
    )


def user_histories(interactions: pl.DataFrame, items: pl.DataFrame) -> dict[str, list[HistoryEntry]]:
    """Per user, ``HistoryEntry`` list ordered oldest first (by timestamp, then item_id).

    Titles carry the year (``display_title``), genres the item's first ``HISTORY_GENRES``; an
    interaction whose item is missing from ``items`` shows its item id as the title. Equal (item, rating)
    entries are one shared object: a catalogue's histories cost a pointer an interaction.
    """
    extra = [c for c in ("year", "genres") if c in items.columns]
    joined = (
        interactions.sort(["user_id", "timestamp", "item_id"])
        .join(items.select(["item_id", "title", *extra]), on="item_id", how="left", maintain_order="left")
        .select(
            "user_id",
            "item_id",
            "title",
            "rating",
            *(pl.col(c) if c in extra else pl.lit(None).alias(c) for c in ("year", "genres")),
        )
    )
    entries: dict[tuple[str, float], HistoryEntry] = {}
    out: dict[str, list[HistoryEntry]] = {}
    for user, item, title, rating, year, genres in joined.iter_rows():
        entry = entries.get((item, rating))
        if entry is None:
            entry = entries[(item, rating)] = HistoryEntry(
                display_title(title or item, year), rating, tuple((genres or [])[:HISTORY_GENRES])
            )
        out.setdefault(user, []).append(entry)
    return out


def iter_item_prompts(items: pl.DataFrame, domain: str) -> Iterable[tuple[str, str]]:
    """(item_id, prompt) for every item row."""
    for row in items.iter_rows(named=True):
        yield row["item_id"], item_prompt(row, domain)


def entity_prompt(task: DecodeTask, req: GenerationRequest, tokenizer: PreTrainedTokenizerBase) -> str:
    """The chat message for ``req`` (user histories truncated to ``max_prompt_tokens`` in ``tokenizer``'s
    tokens)."""
    words = words_for_budget(task.max_new_tokens)
    if req.entity_type == "user":
        return user_prompt(
            req.history or [],
            task.domain,
            user_id=req.entity_id,
            tokenizer=tokenizer,
            max_prompt_tokens=task.max_prompt_tokens,
            max_words=words,
        )
    if req.entity_type == "item":
        return item_prompt(req.item or {"item_id": req.entity_id}, task.domain, max_words=words)
    raise ValueError(f"unknown entity_type {req.entity_type!r}")
