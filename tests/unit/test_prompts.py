"""Prompt templates and the history truncation rule (whitespace tokenizer fakes)."""
from __future__ import annotations

import polars as pl
import pytest

from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS
from pipelines.knowledge.prompts import (PROMPT_VERSION, HistoryEntry, PromptTooLongError, count_prompt_tokens,
                               format_rating, item_prompt, user_histories, user_prompt)


class WhitespaceTokenizer:
    """One token per whitespace-separated word; no chat template."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


class TemplatedTokenizer(WhitespaceTokenizer):
    """Adds a fixed 10-token chat wrapper around the message."""

    chat_template = "fake"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        assert messages[0]["role"] == "user" and add_generation_prompt and tokenize
        return list(range(10 + len(messages[0]["content"].split())))


HISTORY = [HistoryEntry(f"Movie{k} (199{k})", float(1 + k % 5)) for k in range(10)]


def _kept_titles(text: str) -> list[str]:
    return [line.split('"')[1] for line in text.splitlines() if line.startswith('"')]


def test_user_prompt_lists_history_oldest_first():
    text = user_prompt([("Heat (1995)", 4.0, ("Action", "Crime")), ("Up (2009)", 4.5), ("Cats (2019)", 1.0)])
    assert '"Heat (1995)" [Action, Crime], 4 stars;\n"Up (2009)", 4.5 stars;\n"Cats (2019)", 1 star;' in text
    assert "movie" in text and "at most 120 words" in text
    book = user_prompt([("Dune", 5.0)], domain="book")
    assert "rated these books" in book and "authors" in book
    assert PROMPT_VERSION


def test_format_rating():
    assert [format_rating(r) for r in (1.0, 2.0, 4.5, 5)] == ["1 star", "2 stars", "4.5 stars", "5 stars"]


def test_truncation_keeps_newest_entries_and_fits():
    tok = WhitespaceTokenizer()
    full = user_prompt(HISTORY)
    per_entry = len('"Movie0 (1990)", 1 star;'.split())  # 4 words per entry
    budget = len(full.split()) - 3 * per_entry  # room for exactly 7 of the 10 entries
    text = user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=budget)
    assert _kept_titles(text) == [e.title for e in HISTORY[3:]]
    assert count_prompt_tokens(tok, text) <= budget
    # one token less than needed for 7 entries: 6 newest remain
    assert _kept_titles(user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=budget - 1)) == \
        [e.title for e in HISTORY[4:]]
    # a generous budget keeps everything
    assert user_prompt(HISTORY, tokenizer=tok, max_prompt_tokens=10_000) == full


def test_truncation_counts_the_chat_template():
    plain, templated = WhitespaceTokenizer(), TemplatedTokenizer()
    budget = len(user_prompt(HISTORY).split())
    assert len(_kept_titles(user_prompt(HISTORY, tokenizer=plain, max_prompt_tokens=budget))) == 10
    kept = _kept_titles(user_prompt(HISTORY, tokenizer=templated, max_prompt_tokens=budget))
    assert kept == [e.title for e in HISTORY[3:]]  # 10 wrapper tokens cost three 4-token entries


def test_history_that_cannot_fit_names_the_user():
    with pytest.raises(PromptTooLongError, match="user 'u42'.*Movie9"):
        user_prompt(HISTORY, user_id="u42", tokenizer=WhitespaceTokenizer(), max_prompt_tokens=20)
    with pytest.raises(ValueError, match="user 'u7' has an empty history"):
        user_prompt([], user_id="u7")
    with pytest.raises(ValueError, match="unknown prompt domain 'music'"):
        user_prompt(HISTORY, domain="music")


def test_item_prompt_uses_attributes():
    row = {"item_id": "i1", "title": "Heat", "year": 1995, "genres": ["Action", "Crime"], "category": "Action",
           "sub_category": "Crime"}
    text = item_prompt(row)
    assert text.startswith('Describe the movie "Heat (1995)" (genres: Action, Crime) in one concise paragraph')
    book = item_prompt({"item_id": "b", "title": "Dune", "genres": [], "category": "Science Fiction",
                        "sub_category": "Space Opera"}, domain="book")
    assert '"Dune" (category: Science Fiction; sub-category: Space Opera)' in book and "author" in book
    with pytest.raises(ValueError, match="item 'x' has no title"):
        item_prompt({"item_id": "x", "title": None})


def test_user_histories_orders_by_time_and_joins_titles():
    inter = pl.DataFrame([("u1", "b", 5.0, 20), ("u1", "a", 3.0, 10), ("u1", "zz", 4.0, 30), ("u2", "a", 1.0, 5)],
                         schema=INTERACTIONS_SCHEMA, orient="row")
    items = pl.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"], "genres": [["Drama", "War", "Epic"], []],
                          "category": [None, None], "sub_category": [None, None], "year": [1999, None]},
                         schema=ITEM_COLUMNS)
    hist = user_histories(inter, items)
    assert hist == {"u1": [("Alpha (1999)", 3.0, ("Drama", "War")), ("Beta", 5.0, ()), ("zz", 4.0, ())],
                    "u2": [("Alpha (1999)", 1.0, ("Drama", "War"))]}
