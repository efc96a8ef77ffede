"""Prompt templates and the history truncation rule (whitespace tokenizer fakes)."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS
from pipelines.knowledge.prompts import (
    PROMPT_VERSION,
    HistoryEntry,
    PromptTooLongError,
    count_prompt_tokens,
    format_rating,
    item_prompt,
    user_histories,
    user_prompt,
)


class WhitespaceTokenizer:
    """One token per whitespace-separated word; no chat template."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


class TemplatedTokenizer(WhitespaceTokenizer):
    """Adds a fixed 10-token chat wrapper around the message."""

    chat_template = "fake"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        assert messages[0]["role"] == "user" and add_generation_prompt and tokenize and not return_dict
        return list(range(10 + len(messages[0]["content"].split())))


HISTORY = [HistoryEntry(f"Movie{k} (199{k})", float(1 + k % 5)) for k in range(10)]


def _kept_titles(text: str) -> list[str]:
    """``Title (year)`` of each history line (``k. Title: T | Year: Y | ...``)."""
    out = []
    for line in text.splitlines():
        if " | " in line:
            fields = dict(f.split(": ", 1) for f in line.split(". ", 1)[1].split(" | "))
            out.append(f"{fields['Title']} ({fields['Year']})")
    return out


def test_user_prompt_lists_history_oldest_first():
    text = user_prompt([("Heat (1995)", 4.0, ("Action", "Crime")), ("Up (2009)", 4.5), ("Cats (2019)", 1.0)])
    assert (
        "1. Title: Heat | Year: 1995 | Genres: Action, Crime | Rating: 4\n"
        "2. Title: Up | Year: 2009 | Rating: 4.5\n3. Title: Cats | Year: 2019 | Rating: 1\n"
    ) in text
    assert "movie" in text and "at most 120 words" in text
    book = user_prompt([("Dune", 5.0)], domain="book")
    assert "book ratings" in book and "1. Title: Dune | Rating: 5" in book and "reading taste" in book
    assert PROMPT_VERSION


def test_format_rating():
    assert [format_rating(r) for r in (1.0, 2.0, 4.5, 5)] == ["1 star", "2 stars", "4.5 stars", "5 stars"]


def test_truncation_keeps_newest_entries_and_fits():
    tok = WhitespaceTokenizer()
    full = user_prompt(HISTORY)
    per_entry = len("1. Title: Movie0 | Year: 1990 | Rating: 1".split())  # 9 words per entry
    budget = len(full.split()) - 3 * per_entry  # room for exactly 7 of the 10 entries
    text = user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=budget)
    assert _kept_titles(text) == [e.title for e in HISTORY[3:]]
    assert count_prompt_tokens(tok, text) <= budget
    # one token less than needed for 7 entries: 6 newest remain
    assert _kept_titles(user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=budget - 1)) == [
        e.title for e in HISTORY[4:]
    ]
    # a generous budget keeps everything
    assert user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=10_000) == full


def test_truncation_counts_the_chat_template():
    plain, templated = WhitespaceTokenizer(), TemplatedTokenizer()
    budget = len(user_prompt(HISTORY).split())
    assert len(_kept_titles(user_prompt(HISTORY, tokenizer=plain, max_prompt_tokens=budget))) == 10
    kept = _kept_titles(user_prompt(HISTORY, tokenizer=templated, max_prompt_tokens=budget))
    assert kept == [e.title for e in HISTORY[2:]]  # 10 wrapper tokens cost two 9-token entries


def test_history_that_cannot_fit_names_the_user():
    with pytest.raises(PromptTooLongError, match="user 'u42'.*Movie9"):
        user_prompt(HISTORY, user_id="u42", tokenizer=WhitespaceTokenizer(), max_prompt_tokens=20)
    with pytest.raises(ValueError, match="user 'u7' has an empty history"):
        user_prompt([], user_id="u7")
    with pytest.raises(ValueError, match="unknown prompt domain 'music'"):
        user_prompt(HISTORY, domain="music")


def test_item_prompt_uses_attributes():
    row = {
        "item_id": "i1",
        "title": "Heat",
        "year": 1995,
        "genres": ["Action", "Crime"],
        "category": "Action",
        "sub_category": "Crime",
    }
    text = item_prompt(row, max_words=30)
    assert text.startswith(
        "A movie:\nTitle: Heat\nYear: 1995\nGenres: Action, Crime\n\nIn 1 or 2 sentences (at most 30 words"
    )
    book = item_prompt(
        {"item_id": "b", "title": "Dune", "genres": [], "category": "Science Fiction", "sub_category": "Space Opera"},
        domain="book",
    )
    assert "Title: Dune\nCategory: Science Fiction\nSub-category: Space Opera\n" in book and "kind of book" in book
    with pytest.raises(ValueError, match="item 'x' has no title"):
        item_prompt({"item_id": "x", "title": None})


def test_user_histories_orders_by_time_and_joins_titles():
    inter = pl.DataFrame(
        [("u1", "b", 5.0, 20), ("u1", "a", 3.0, 10), ("u1", "zz", 4.0, 30), ("u2", "a", 1.0, 5)],
        schema=INTERACTIONS_SCHEMA,
        orient="row",
    )
    items = pl.DataFrame(
        {
            "item_id": ["a", "b"],
            "title": ["Alpha", "Beta"],
            "genres": [["Drama", "War", "Epic"], []],
            "category": [None, None],
            "sub_category": [None, None],
            "year": [1999, None],
        },
        schema=ITEM_COLUMNS,
    )
    hist = {u: [tuple(e[:3]) for e in entries] for u, entries in user_histories(inter, items).items()}
    assert hist == {
        "u1": [("Alpha (1999)", 3.0, ("Drama", "War")), ("Beta", 5.0, ()), ("zz", 4.0, ())],
        "u2": [("Alpha (1999)", 1.0, ("Drama", "War"))],
    }


def test_asked_length_leaves_headroom_in_the_budget():
    from pipelines.knowledge.prompts import HEADROOM, TOKENS_PER_WORD, words_for_budget

    for budget in (64, 96, 256):
        assert words_for_budget(budget) * TOKENS_PER_WORD <= HEADROOM * budget
    assert words_for_budget(96) == 30 and words_for_budget(1000) == 120


def test_a_tokenizer_without_a_chat_template_is_prompted_plainly_everywhere_alike(tiny_model):
    """A base model's tokenizer (no chat template): the decoders encode the text as it is (they used to fail),
    and the prompt counter counts exactly what they encode."""
    import laser
    from laser.models import chat_ids

    lm = laser.load_model(tiny_model, device="cpu", dtype="float32")
    assert lm.tokenizer is not None and lm.tokenizer.chat_template  # the templated tokenizer first
    text = "Analyse this user's preferences"
    templated = chat_ids(lm.tokenizer, text)
    lm.tokenizer.chat_template = None
    plain = laser.get_decoder("autoregressive", lm).encode(text)
    assert plain == lm.tokenizer.encode(text) != templated
    assert count_prompt_tokens(lm.tokenizer, text) == len(plain)
    assert laser.get_decoder("autoregressive", lm).generate(text, max_new_tokens=3).stats.new_tokens >= 1
