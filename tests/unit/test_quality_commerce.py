"""Item grounding of e-commerce texts: brands and prices counted, movie and book items scored as before."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from pipelines.knowledge.provenance import generation_hash
from pipelines.knowledge.records import DecodeTask
from pipelines.quality import catalogue_brands, entity_quality, item_grounding, money_amounts

CATALOGUE = ("Starbucks", "Taco Bell", "Regal", "Regal Entertainment", "GAP", "IHOP", "Generic")
CARD = {"title": "Starbucks Gift Card", "brand": "Starbucks", "price": 25.0}


def _counts(text: str, item: dict, brands=CATALOGUE) -> tuple[dict, dict]:
    g = item_grounding(text, item, brands=brands)
    return g.mentioned, g.matched


def test_money_amounts_read_every_written_form():
    text = "It costs $12.99 (12.99 dollars, USD 12, US$5, $1,299.99); rated 4.5 stars in 2019, 3 cards."
    assert money_amounts(text) == [12.99, 12.99, 12.0, 5.0, 1299.99]


def test_own_brand_matches_and_another_catalogue_brand_is_invented():
    assert _counts("A Starbucks card.", CARD) == ({"brands": 1}, {"brands": 1})
    assert _counts("A STARBUCKS card, good at Taco  Bell too.", CARD) == ({"brands": 2}, {"brands": 1})
    assert _counts("A card for starbucksy treats.", CARD) == ({}, {})  # whole words only


def test_short_and_non_brands_are_not_counted():
    assert _counts("A generic gift at IHOP.", CARD) == ({"brands": 1}, {"brands": 0})  # "generic" is no brand
    assert _counts("Go on.", CARD, brands=("Go",)) == ({}, {})  # under 3 characters


def test_longest_brand_counts_once_and_the_title_supports_a_brand():
    item = {"title": "Regal Entertainment Group Gift Card", "brand": "Regal", "price": None}
    assert _counts("A Regal Entertainment card.", item) == ({"brands": 1}, {"brands": 1})  # named by the title
    other = {**item, "title": "Regal Gift Card"}
    assert _counts("A Regal Entertainment card.", other) == ({"brands": 1}, {"brands": 0})
    assert _counts("A Regal card.", other) == ({"brands": 1}, {"brands": 1})


@pytest.mark.parametrize(
    ("said", "ok"),
    [("$25", True), ("$25.24", True), ("$25.26", False), ("24.76 dollars", True), ("$24", False), ("USD 25", True)],
)
def test_price_matches_within_one_percent(said, ok):
    assert _counts(f"A card for {said}.", CARD, brands=()) == ({"prices": 1}, {"prices": int(ok)})


def test_price_within_a_cent_and_invented_without_a_price():
    cheap = {"title": "Sticker", "brand": None, "price": 0.5}
    assert _counts("Only $0.51.", cheap, brands=()) == ({"prices": 1}, {"prices": 1})  # 1% would be half a cent
    assert _counts("Only $0.52.", cheap, brands=()) == ({"prices": 1}, {"prices": 0})
    unpriced = {"title": "Starbucks Gift Card", "brand": "Starbucks", "price": None}
    assert _counts("Worth $25.", unpriced, brands=()) == ({"prices": 1}, {"prices": 0})
    shown = {"title": "iTunes - Gift Card $15", "brand": "iTunes", "price": None}
    assert _counts("A $15 card, not $50.", shown, brands=()) == ({"prices": 2}, {"prices": 1})  # the title's amount


def test_items_without_brand_or_price_columns_score_as_before():
    movie = {"title": "Alien (1979)", "genres": ["Sci-Fi", "Horror"], "year": 1979}
    text = "Alien (1979) is a science fiction horror film that cost $11 million, shown at Regal cinemas."
    g = item_grounding(text, movie)
    assert (g.mentioned, g.matched) == ({"genres": 2, "years": 1}, {"genres": 2, "years": 1})
    with_catalogue = item_grounding(text, movie, brands=CATALOGUE)  # a book/movie table has no brand column
    assert with_catalogue.mentioned == {"genres": 2, "years": 1, "brands": 1}
    book = {"title": "Dune", "genres": ["Science Fiction"], "category": "Books"}
    assert item_grounding("Dune sells for $9.99, a science fiction classic.", book).mentioned == {"genres": 1}


def test_catalogue_brands_from_the_items_table():
    items = pl.DataFrame({"item_id": ["a", "b", "c", "d"], "brand": ["Starbucks", " GAP ", None, "unknown"]})
    assert catalogue_brands(items) == ("gap", "starbucks")
    assert catalogue_brands(items.drop("brand")) == ()


def test_entity_quality_counts_catalogue_brands_and_they_leave_the_config_hash_alone():
    q = entity_quality("A Starbucks card, also at Taco Bell.", "eos", "item", item=CARD, brands=CATALOGUE)
    assert q.grounding is not None and q.grounding.share == 0.5
    task = DecodeTask("autoregressive")
    branded = dataclasses.replace(task, brands=("starbucks",))
    assert generation_hash("m", "auto", dataclasses.asdict(task)) == generation_hash(
        "m", "auto", dataclasses.asdict(branded)
    )
