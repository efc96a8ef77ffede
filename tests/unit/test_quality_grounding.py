"""Quality measures on hand-made texts: exact thresholds, how a text ended, fragments, grounding."""

from __future__ import annotations

import pytest

from pipelines.quality import (
    MAX_REPEAT_4GRAM,
    QualitySummary,
    item_grounding,
    repeated_ngram_share,
    text_quality,
    user_grounding,
)

HISTORY = [
    ("Heat (1995)", 4.0, ("Action", "Crime")),
    ("The Silence of the Lambs (1991)", 4.5, ("Crime", "Horror")),
    ("Toy Story (1995)", 2.0, ("Animation", "Children")),
]


def test_threshold_compares_exactly():
    text = "a b c d e a b c d"  # 6 4-grams, 1 repeat (abcd): 1/6 < 1/5
    assert not text_quality(text + ".", "eos").degenerate
    five = "w x y z w x y z"  # 5 4-grams, 1 repeat: exactly 1/5 -> degenerate
    q = text_quality(five, "eos")
    assert q.repeat_4gram == MAX_REPEAT_4GRAM and q.degenerate
    # 3 repeats in 15 4-grams: 1 - 12/15 is 0.19999999999999996 in floats, which once passed the 0.2 limit
    looped = "a b c d e f g h i j k l a b c d e f"
    assert repeated_ngram_share(looped) == 3 / 15 == 0.2
    assert text_quality(looped, "eos").degenerate


def test_stored_flags_agree_with_the_stored_share():
    for text in (
        "a b c d a b c d.",
        "one two three four five six seven eight nine ten one two three four.",
        "w x y z w x y z w x y z w x y z w x y z.",
    ):
        q = text_quality(text, "eos")
        assert q.degenerate == (q.repeat_4gram >= MAX_REPEAT_4GRAM)


def test_ended_cut_and_fragment():
    prose = 'This user enjoys tense crime films such as "Heat" and thrillers.'
    assert text_quality(prose, "eos").ended and not text_quality(prose, "eos").cut
    at_limit = text_quality(prose, "length")  # hit the limit exactly at a sentence end: ended, not cut
    assert at_limit.ended and not at_limit.cut and not at_limit.fragment
    assert text_quality("This user enjoys tense crime films\n\n", "stop").ended  # a stop string ended it
    cut = text_quality("This user enjoys tense crime films such as", "length")
    assert cut.cut and not cut.ended and cut.fragment and cut.flawed
    issue = "Its director, John Hust\n (Bruce Willis)\n\nThe Shawshank Redemption (199"
    q = text_quality(issue, "eos")
    assert q.repeat_4gram == 0.0 and q.fragment and q.flawed  # scored 0.0 and passed before
    assert text_quality('He said "yes to all of it.', "eos").fragment  # odd quotes
    assert text_quality("1995, 1996, 1997, 1998, 2000 ... 12 34.", "eos").fragment  # few letters


def test_user_grounding_counts_titles_genres_and_ratings():
    text = (
        'This user enjoys crime and action films like "Heat" and The Silence of the Lambs (4.5 stars), '
        "but not animation."
    )
    g = user_grounding(text, HISTORY)
    assert g.mentioned == {"titles": 2, "genres": 3, "ratings": 1} and g.share == 1.0


def test_user_grounding_catches_invented_facts():
    # the issue's rating confusion: 1.5 stars next to a 4.5-star title; an invented title; a genre not in the history
    text = 'This user enjoys The Silence of the Lambs (1.5 stars), "The Tower in the Border" and westerns.'
    g = user_grounding(text, HISTORY)
    assert g.matched == {"titles": 1, "ratings": 0, "genres": 0}
    assert g.mentioned == {"titles": 2, "ratings": 1, "genres": 1}
    assert g.share == pytest.approx(1 / 4)


def test_genre_words_inside_a_title_are_not_genre_mentions():
    g = user_grounding('They loved "Western Horror Night".', [("Western Horror Night", 5.0, ("Drama",))])
    assert g.mentioned == {"titles": 1}


def test_item_grounding_checks_genres_and_year():
    item = {"item_id": "i1", "title": "Alien", "year": 1979, "genres": ["Horror", "Sci-Fi"]}
    good = item_grounding("Alien (1979) is a science fiction horror film, a landmark of the 1970s.", item)
    assert good.mentioned == {"genres": 2, "years": 2} and good.share == 1.0
    bad = item_grounding("Alien is a 1986 romantic comedy.", item)
    assert bad.matched == {"years": 0, "genres": 0} and bad.mentioned == {"years": 1, "genres": 1}
    assert item_grounding("A film.", {"title": "X"}).share is None  # nothing to check


def test_summary_shares_and_grounding():
    s = QualitySummary()
    s.add(text_quality("This user enjoys crime films.", "eos", 40, user_grounding("crime", HISTORY)))
    s.add(text_quality("This user enjoys westerns and", "length", 40, user_grounding("westerns", HISTORY)))
    d = s.as_dict()
    assert (d["ended"], d["cut"], d["fragment"], d["facts_mentioned"], d["facts_matched"]) == (1, 1, 1, 2, 1)
    assert d["grounding"] == 0.5 and d["grounding_by_kind"] == {"genres": {"matched": 1, "mentioned": 2}}
    assert d["mean_length_ratio"] == pytest.approx(5 / 40)
