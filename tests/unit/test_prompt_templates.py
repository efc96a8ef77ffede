"""The shipped movie and book templates reproduce the prompts of the Python code they replaced (kar-v5),
text and token ids, for every user and item of the synthetic, MovieLens-like and Amazon-like test data."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

import laser
from laser.models import chat_ids
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset
from pipelines.data.synthetic import synthetic_dataset
from pipelines.data.config import SyntheticParams
from pipelines.prompts.template import shipped_template
from pipelines.knowledge.prompts import (
    PROMPT_VERSION,
    HistoryEntry,
    as_text,
    item_prompt,
    split_year,
    user_histories,
    user_prompt,
)

# ---- the kar-v5 prompts as pipelines/knowledge/prompts.py wrote them before templates (frozen oracle) ----
_USER_INTRO = {
    "movie": "A user's movie ratings, oldest first (rating 1 = disliked, 5 = loved):",
    "book": "A user's book ratings, oldest first (rating 1 = disliked, 5 = loved):",
}
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


def _old_history_line(k: int, e: HistoryEntry) -> str:
    title, year = split_year(e.title)
    fields = (
        [f"Title: {as_text(title)}"]
        + ([f"Year: {year}"] if year else [])
        + ([f"Genres: {', '.join(as_text(g) for g in e.genres)}"] if e.genres else [])
        + [f"Rating: {e.rating:g}"]
    )
    return f"{k}. " + " | ".join(fields)


def _old_user(entries: Sequence[HistoryEntry], domain: str, max_words: int) -> str:
    lines = [_old_history_line(k, e) for k, e in enumerate(entries, 1)]
    return "\n".join([_USER_INTRO[domain], *lines, "", _USER_ASK[domain].format(w=max_words)])


def _old_user_fitted(entries, domain, tok, budget, max_words) -> str:
    keep = max(
        k
        for k in range(1, len(entries) + 1)
        if len(chat_ids(tok, _old_user(entries[-k:], domain, max_words))) <= budget
    )
    return _old_user(entries[-keep:], domain, max_words)


def _old_item(item: dict, domain: str, max_words: int) -> str:
    parts = [f"Year: {as_text(item['year'])}"] if item.get("year") else []
    genres = item.get("genres")
    if genres:
        parts.append("Genres: " + ", ".join(as_text(g) for g in genres))
    for key in ("category", "sub_category"):
        value = item.get(key)
        if value and not (genres and value in genres):
            parts.append(f"{key.replace('_', '-').capitalize()}: {as_text(value)}")
    return "\n".join(
        [_ITEM_INTRO[domain], f"Title: {as_text(item['title'])}", *parts, "", _ITEM_ASK[domain].format(w=max_words)]
    )


# ---- test data ----------------------------------------------------------------------------------------------


def _movielens(tmp_path):
    flags = lambda *on: "|".join("1" if i in on else "0" for i in range(19))  # noqa: E731
    (tmp_path / "u.data").write_text(
        "".join(f"{u}\t{i}\t{1 + (u * i) % 5}\t{881250949 + 7 * u + i}\n" for u in range(1, 6) for i in range(10, 40))
    )
    items = [
        f"{i}|{'Café Society, The (1995)' if i == 10 else f'Film {i} ({1950 + i})' if i % 3 else f'Heat {i}'}"
        f"|01-Jan-1995||http://x|{flags(i % 19, (i * 7) % 19) if i % 4 else flags()}\n"
        for i in range(10, 40)
    ]
    (tmp_path / "u.item").write_bytes("".join(items).encode("latin-1"))
    (tmp_path / "u.user").write_text("".join(f"{u}|{20 + u}|M|technician|85711\n" for u in range(1, 6)))
    return load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))


def _amazon(tmp_path):
    reviews = [
        {"user_id": f"U{u}", "parent_asin": f"P{i}", "rating": 1 + (u + i) % 5, "timestamp": 1600000000 + u * 100 + i}
        for u in range(4)
        for i in range(12)
    ]
    cats = [["Books", "Science Fiction", "Space Opera"], ["Books"], [], ["Books", "Cookbooks"]]
    meta = [
        {
            "parent_asin": f"P{i}",
            "title": "Deep <|im_end|> Space [INST]" if i == 0 else f"Book {i}",
            "categories": cats[i % 4],
            **({"date": f"March {1990 + i}"} if i % 2 else {}),
        }
        for i in range(12)
    ]
    (tmp_path / "Books.jsonl").write_text("\n".join(json.dumps(r) for r in reviews) + "\n")
    (tmp_path / "meta_Books.jsonl").write_text("\n".join(json.dumps(r) for r in meta) + "\n")
    return load_dataset(
        DatasetConfig(format="amazon", path=str(tmp_path / "Books.jsonl"), metadata_file="meta_Books.jsonl")
    )


# rows whose category is not among their genres, or that lack fields: what the loaders above never give
HAND_ITEMS = [
    {"item_id": "h1", "title": "Dune", "genres": [], "category": "Science Fiction", "sub_category": "Space Opera"},
    {"item_id": "h2", "title": "Heat", "year": 1995, "genres": ["Crime"], "category": "Drama", "sub_category": "Crime"},
    {"item_id": "h3", "title": "Up", "year": 0, "genres": None, "category": None, "sub_category": "Family"},
    {"item_id": "h4", "title": "Alien </s>", "genres": ["[INST] Horror"], "category": "<|im_start|>x"},
]


@pytest.fixture(scope="module")
def smol():
    return laser.load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    syn = synthetic_dataset(SyntheticParams(n_users=40, n_items=60), seed=3)
    ml = _movielens(tmp_path_factory.mktemp("ml"))
    amz = _amazon(tmp_path_factory.mktemp("amz"))
    return {"synthetic": syn, "movielens": ml, "amazon": amz}


@pytest.mark.parametrize("name", ["synthetic", "movielens", "amazon"])
@pytest.mark.parametrize("domain", ["movie", "book"])
def test_shipped_templates_reproduce_the_kar_v5_prompts(datasets, smol, name, domain):
    ds = datasets[name]
    items = list(ds.items.iter_rows(named=True)) + HAND_ITEMS
    assert len(items) >= 12
    for k, item in enumerate(items):
        words = (120, 30, 10)[k % 3]
        new, old = item_prompt(item, domain, max_words=words), _old_item(item, domain, words)
        assert new == old, item["item_id"]
        assert chat_ids(smol, new) == chat_ids(smol, old)
    histories = user_histories(ds.interactions, ds.items)
    assert len(histories) >= 4
    for user, entries in histories.items():
        assert user_prompt(entries, domain) == _old_user(entries, domain, 120)
        budget = len(chat_ids(smol, _old_user(entries[-3:], domain, 60))) + 5  # a long history cut to its newest
        new = user_prompt(entries, domain, user_id=user, tokenizer=smol, max_prompt_tokens=budget, max_words=60)
        old = _old_user_fitted(entries, domain, smol, budget, 60)
        assert new == old, user
        assert chat_ids(smol, new) == chat_ids(smol, old)


def test_shipped_movie_and_book_keep_their_version():
    """A scheduled run regenerates nothing because the prompts became templates: movie and book are still
    kar-v5 (their header line); a system prompt or another template is versioned by its hash."""
    assert PROMPT_VERSION == "kar-v5"
    assert shipped_template("movie").version == shipped_template("book").version == "kar-v5"
    with_system = shipped_template("movie", system="You write short profiles.")
    assert with_system.version.startswith("tpl-") and with_system.version != shipped_template("book", "x").version
