"""Trial samples (`dataset.limit_users` / `limit_items`, pipelines/data/load.py `limit_dataset`): both limits
honoured, the users asked for kept, and one logged line that says what was kept and why."""

from __future__ import annotations

import logging

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.data import Dataset, DatasetConfig, SyntheticParams, limit_dataset, load_dataset
from pipelines.data.load import user_order
from pipelines.data.synthetic import synthetic_dataset

SMALL = SyntheticParams(n_users=120, n_items=150, n_clusters=3)
SCHEMA = {"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64, "timestamp": pl.Int64}


def _ml_like() -> Dataset:
    """Like MovieLens: every user has 25 ratings; 5 items everyone rated and many rated once."""
    rows = [(f"u{u}", f"pop{i}", 4.0, 100 + i) for u in range(10) for i in range(5)]
    rows += [(f"u{u}", f"rare{u}-{j}", 3.0, 200 + j) for u in range(10) for j in range(20)]
    inter = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    items = pl.DataFrame({"item_id": sorted(set(inter["item_id"]))}).with_columns(title=pl.col("item_id"))
    users = pl.DataFrame({"user_id": [f"u{u}" for u in range(12)]})  # two users never rated anything
    return Dataset("ml-like", "movie", inter, items, users)


def _niche() -> Dataset:
    """u0-u4 rate pop0-pop2; u5 rated only its own niche item, so the most-rated items leave it empty."""
    rows = [(f"u{u}", f"pop{i}", 4.0, 100 + i) for u in range(5) for i in range(3)] + [("u5", "niche", 5.0, 300)]
    inter = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    items = pl.DataFrame({"item_id": sorted(set(inter["item_id"]))}).with_columns(title=pl.col("item_id"))
    return Dataset("niche", "movie", inter, items, pl.DataFrame({"user_id": [f"u{u}" for u in range(6)]}))


def test_default_sample_keeps_the_users_asked_and_caps_the_items(caplog):
    """The issue's case: limit_users 12 x limit_items 12 kept 1 user and 57 items (whole histories)."""
    ds = _ml_like()
    with caplog.at_level(logging.INFO):
        small = limit_dataset(ds, limit_users=8, limit_items=8, seed=0)
    assert small.users.height == 8 and small.items.height == 8
    assert set(small.users["user_id"]) == set(user_order(ds.interactions, 0)[:8])
    # the 5 items every user rated, then 3 rated once (ties by item id); histories cut to the kept items
    assert small.items["item_id"].sort().to_list()[:5] == [f"pop{i}" for i in range(5)]
    assert set(small.interactions["item_id"]) == set(small.items["item_id"])
    assert small.interactions.height == 8 * 5 + 3
    assert small.notes["sample_kept_users"] == "8 of 12 (66.7%)"
    assert small.notes["sample_dropped_interactions"] == 8 * 25 - 43
    assert small.notes["sample_users_without_interactions"] == 0
    line = small.notes["sample"]
    assert line.startswith("trial sample (sample_items=most_rated, seed 0): users 8 kept of 8 asked (10 with ratings)")
    assert "items 8 kept of 8 asked: the most-rated of the 165 items the kept users rated" in line
    assert "interactions 43 kept of the kept users' 200" in line and "dropped" not in line
    assert line in caplog.text
    again = limit_dataset(ds, limit_users=8, limit_items=8, seed=0)
    assert_frame_equal(small.interactions, again.interactions)
    other = limit_dataset(ds, limit_users=8, limit_items=8, seed=1)
    assert set(other.users["user_id"]) != set(small.users["user_id"])


def test_default_sample_on_movielens_1m_files(tmp_path):
    """MovieLens-1M files through load_dataset with the config's defaults: both limits honoured."""
    ratings = [
        f"{u}::{m}::{1 + (u * m) % 5}::{978300000 + u * 100 + m}"
        for u in range(1, 31)
        for m in range(1, 61)
        if (u + m) % 3 == 0 or m <= 4
    ]
    (tmp_path / "ratings.dat").write_text("\n".join(ratings) + "\n")
    (tmp_path / "movies.dat").write_text("".join(f"{m}::Movie {m} (1990)::Drama|Comedy\n" for m in range(1, 61)))
    (tmp_path / "users.dat").write_text("".join(f"{u}::F::25::1::00000\n" for u in range(1, 31)))
    ds = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path), limit_users=12, limit_items=12))
    assert ds.users.height == 12 and ds.items.height == 12
    assert ds.interactions["user_id"].n_unique() == 12 and ds.interactions["item_id"].n_unique() == 12
    assert "users 12 kept of 12 asked" in ds.notes["sample"] and "items 12 kept of 12 asked" in ds.notes["sample"]


def test_items_that_give_every_user_a_rating_come_first():
    small = limit_dataset(_niche(), limit_users=6, limit_items=3, seed=0)
    assert small.users.height == 6  # the top 3 (pop0-2) would have left u5 with nothing
    assert set(small.items["item_id"]) == {"pop0", "niche", "pop1"}
    assert "(1 of them in place of more-rated ones, so that every kept user keeps a rating)" in small.notes["sample"]
    assert small.notes["sample_users_without_interactions"] == 0


def test_users_are_dropped_only_when_the_item_limit_cannot_cover_them():
    small = limit_dataset(_niche(), limit_users=6, limit_items=1, seed=0)
    assert small.users.height == 5 and set(small.items["item_id"]) == {"pop0"}
    assert small.notes["sample_users_without_interactions"] == 1
    assert (
        "1 drawn users dropped: none of their ratings is among the kept items (limit_items=1 is too few to "
        "give each of the 6 users one)"
    ) in small.notes["sample"]


def test_limit_users_alone_keeps_whole_histories_and_limit_items_alone_keeps_every_user():
    ds = synthetic_dataset(SMALL, seed=0)
    users_only = load_dataset(DatasetConfig(limit_users=10, synthetic=SMALL))
    assert users_only.users.height == 10
    full = ds.interactions.filter(pl.col("user_id").is_in(users_only.users["user_id"].implode()))
    assert users_only.interactions.height == full.height
    assert set(users_only.items["item_id"]) == set(users_only.interactions["item_id"])
    assert (
        "no limit_items" in users_only.notes["sample"]
        and "every item the kept users rated" in users_only.notes["sample"]
    )
    items_only = limit_dataset(ds, None, 40, seed=0)
    assert items_only.items.height == 40
    n = ds.interactions["user_id"].n_unique()
    assert items_only.users.height + items_only.notes["sample_users_without_interactions"] == n
    assert f"of no limit_users ({n} with ratings)" in items_only.notes["sample"]


def test_whole_histories_never_cuts_and_never_passes_the_item_limit(caplog):
    ds = _ml_like()
    small = limit_dataset(ds, limit_users=3, limit_items=80, seed=0, sample_items="whole_histories")
    per_user = small.interactions.group_by("user_id").len()
    assert per_user.height == 3 and set(per_user["len"]) == {25}
    assert small.items.height == 5 + 3 * 20 <= 80
    assert small.notes["sample_kept_items"] == "65 of 205 (31.7%)"
    two = limit_dataset(ds, limit_users=8, limit_items=50, seed=0, sample_items="whole_histories")
    assert two.users.height == 2 and two.items.height == 45  # a third user would take the items to 65
    assert two.notes["sample_users_passed_over_for_limit_items"] == 8
    assert (
        "users 2 kept of 8 asked (10 with ratings); 8 passed over: their whole history would take the items "
        "past limit_items=50"
    ) in two.notes["sample"]
    with pytest.raises(ValueError, match="smallest history has 25 items, more than limit_items=8"):
        limit_dataset(ds, limit_users=8, limit_items=8, seed=0, sample_items="whole_histories")
    with pytest.raises(ValueError, match="sample_items"):
        limit_dataset(ds, limit_users=8, limit_items=8, sample_items="top")


def test_config_default_is_most_rated_and_accepts_both_rules():
    assert DatasetConfig().sample_items == "most_rated"
    assert DatasetConfig(sample_items="whole_histories").sample_items == "whole_histories"
