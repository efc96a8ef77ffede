"""Synthetic demo data, seeded trial limits and the paper's old/new split."""
from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.data import Dataset, DatasetConfig, SyntheticParams, limit_dataset, load_dataset, split_old_new
from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS
from pipelines.data.split import split_histories
from pipelines.data.synthetic import generate, synthetic_dataset

SMALL = SyntheticParams(n_users=120, n_items=150, n_clusters=3)


def test_synthetic_deterministic_per_seed():
    a, b, c = synthetic_dataset(SMALL, seed=1), synthetic_dataset(SMALL, seed=1), synthetic_dataset(SMALL, seed=2)
    for name in ("interactions", "items", "users"):
        assert_frame_equal(getattr(a, name), getattr(b, name))
    assert not a.interactions.equals(c.interactions)


def test_synthetic_shape_and_schema():
    ds = load_dataset(DatasetConfig())  # the embedded default
    assert (ds.users.height, ds.items.height) == (300, 400)
    assert dict(ds.interactions.schema) == INTERACTIONS_SCHEMA
    assert {n: ds.items.schema[n] for n in ITEM_COLUMNS} == ITEM_COLUMNS
    assert ds.items["title"].n_unique() == 400 and ds.items["title"].null_count() == 0
    assert ds.items["genres"].list.len().min() >= 1
    assert (ds.items["category"] == ds.items["genres"].list.first()).all()
    assert set(ds.users.columns) == {"user_id", "age", "gender", "occupation"}
    assert ds.interactions.select("user_id", "item_id").is_unique().all()
    assert ds.interactions["rating"].is_between(1, 5).all()


def test_synthetic_cold_users_and_items():
    ds = synthetic_dataset(SMALL, seed=0)
    per_user = ds.interactions.group_by("user_id").len()
    cold_users = per_user.filter(pl.col("len") <= 3).height
    assert cold_users == round(SMALL.cold_user_fraction * SMALL.n_users)  # warm users have >= min_history (6)
    per_item = ds.items.join(ds.interactions.group_by("item_id").len(), on="item_id", how="left")
    counts = per_item["len"].fill_null(0)
    assert (counts == 0).sum() >= 1 and (counts <= 2).sum() >= round(SMALL.cold_item_fraction * SMALL.n_items)


def test_synthetic_planted_clusters_rate_their_genres_higher():
    ds, truth = generate(SMALL, seed=3)
    rated = (ds.interactions.join(truth, on="user_id").join(ds.items.select("item_id", "category"), on="item_id")
             .with_columns(liked=pl.col("liked_genres").list.contains(pl.col("category"))))
    means = dict(rated.group_by("liked").agg(pl.col("rating").mean()).rows())
    assert means[True] > 4.0 and means[False] < 3.3
    share = rated.filter(pl.col("user_id").is_in(
        ds.interactions.group_by("user_id").len().filter(pl.col("len") > 3)["user_id"].implode()))["liked"].mean()
    assert share > 0.45  # by chance (2-3 liked of 16 genres) about 0.16; below 0.75 as picks exhaust small clusters


def _tiny() -> Dataset:
    """u1: 5 interactions, u2: 2, u3: 1, u4: 8 (two share a timestamp: item_id breaks the tie)."""
    rows = ([("u1", f"a{k}", 4.0, 100 - k) for k in range(5)]  # reverse time order on input
            + [("u2", "b0", 3.0, 10), ("u2", "b1", 5.0, 5)] + [("u3", "c0", 2.0, 1)]
            + [("u4", f"d{k}", 1.0, 50 + k // 2 * 2) for k in range(8)])
    inter = pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row")
    ids = sorted(inter["item_id"].unique().to_list())
    items = pl.DataFrame({"item_id": ids, "title": ids, "genres": [[i[0]] for i in ids],
                          "category": [i[0] for i in ids], "sub_category": [None] * len(ids),
                          "year": [None] * len(ids)}, schema=ITEM_COLUMNS)
    return Dataset("tiny", "movie", inter, items, inter.select("user_id").unique().sort("user_id"))


def test_split_hand_computed_cut():
    ds = _tiny()
    split = split_old_new(ds, max_hist=3, new_count=2)
    old = split.old_interactions.group_by("user_id", maintain_order=True).agg("item_id")
    new = split.new_interactions.group_by("user_id", maintain_order=True).agg("item_id")
    # u1 n=5: m=min(3,3)=3, time order a4,a3,a2,a1,a0; u2 n=2: m=1; u3 n=1: no old; u4 n=8: m=min(4,3)=3
    assert dict(old.rows()) == {"u1": ["a4", "a3", "a2"], "u2": ["b1"], "u4": ["d0", "d1", "d2"]}
    assert dict(new.rows()) == {"u1": ["a1", "a0"], "u2": ["b0"], "u3": ["c0"], "u4": ["d3", "d4"]}


@pytest.mark.parametrize("max_hist", [1, 3, 30])
def test_split_invariants(max_hist):
    ds = synthetic_dataset(SMALL, seed=4)
    split = split_old_new(ds, seed=9, max_hist=max_hist, new_count=10_000)  # new part = everything after the cut
    both = pl.concat([split.old_interactions, split.new_interactions])
    assert both.height == ds.interactions.height  # nothing lost or duplicated
    assert_frame_equal(both.sort(["user_id", "item_id"]), ds.interactions.sort(["user_id", "item_id"]))
    last_old = split.old_interactions.group_by("user_id").agg(pl.col("timestamp").max().alias("t_old"))
    first_new = split.new_interactions.group_by("user_id").agg(pl.col("timestamp").min().alias("t_new"))
    assert last_old.join(first_new, on="user_id").filter(pl.col("t_old") > pl.col("t_new")).is_empty()
    n_old = split.old_interactions.group_by("user_id").len()
    assert n_old["len"].max() <= max_hist
    singles = ds.interactions.group_by("user_id").len().filter(pl.col("len") == 1)["user_id"]
    assert not split.old_interactions["user_id"].is_in(singles.implode()).any()


def test_split_default_new_window_is_max_hist():
    ds = synthetic_dataset(SyntheticParams(n_users=30, n_items=80, min_history=30, max_history=40), seed=0)
    old, new = split_histories(ds.interactions, max_hist=5, new_count=5)
    split = split_old_new(ds, max_hist=5)
    assert_frame_equal(split.old_interactions, old) and assert_frame_equal(split.new_interactions, new)
    assert new.group_by("user_id").len()["len"].max() == 5


def test_item_split_per_category_deterministic():
    ds = synthetic_dataset(SMALL, seed=5)
    a, b = split_old_new(ds, seed=1), split_old_new(ds, seed=1)
    assert_frame_equal(a.new_items, b.new_items)
    assert not split_old_new(ds, seed=2).new_items.equals(a.new_items)
    existing, new = set(a.existing_items["item_id"]), set(a.new_items["item_id"])
    assert not existing & new and existing | new == set(ds.items["item_id"])
    sizes = ds.items.group_by("category").len()
    n_new = a.new_items.group_by("category").len().rename({"len": "new"})
    for category, size, new_count in sizes.join(n_new, on="category", how="left").fill_null(0).rows():
        assert new_count == round(0.5 * size), category
    assert split_old_new(ds, new_item_fraction=0.0).new_items.is_empty()


def test_limit_dataset_seeded_and_keeps_whole_histories():
    ds = synthetic_dataset(SMALL, seed=0)
    small = limit_dataset(ds, limit_users=20, limit_items=60, seed=7)
    again = limit_dataset(ds, limit_users=20, limit_items=60, seed=7)
    assert_frame_equal(small.interactions, again.interactions)
    assert small.items.height <= 60 and 1 <= small.users.height <= 20
    # every kept user keeps every interaction it has, and the items table is exactly the items they touched
    expected = ds.interactions.filter(pl.col("user_id").is_in(small.users["user_id"].implode()))
    assert_frame_equal(small.interactions, expected)
    assert set(small.items["item_id"]) == set(small.interactions["item_id"])
    users_only = load_dataset(DatasetConfig(limit_users=10, synthetic=SMALL))
    assert users_only.users.height == 10
    assert set(users_only.items["item_id"]) == set(users_only.interactions["item_id"])
    full_histories = ds.interactions.filter(pl.col("user_id").is_in(users_only.users["user_id"].implode()))
    assert users_only.interactions.height == full_histories.height


def _ml_like() -> Dataset:
    """Like ml-latest-small: every user has >= 20 ratings; a few popular items and many rare ones."""
    rows = [(f"u{u}", f"pop{i}", 4.0, 100 + i) for u in range(10) for i in range(5)]
    rows += [(f"u{u}", f"rare{u}-{j}", 3.0, 200 + j) for u in range(10) for j in range(20)]
    inter = pl.DataFrame(rows, schema={"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64,
                                       "timestamp": pl.Int64}, orient="row")
    items = pl.DataFrame({"item_id": sorted(set(inter["item_id"]))}).with_columns(title=pl.col("item_id"))
    users = pl.DataFrame({"user_id": [f"u{u}" for u in range(12)]})  # two users never rated anything
    return Dataset("ml-like", "movie", inter, items, users)


def test_trial_sample_says_how_much_it_kept(caplog):
    ds = _ml_like()
    with caplog.at_level("INFO"):
        small = limit_dataset(ds, limit_users=3, limit_items=80, seed=0)
    per_user = small.interactions.group_by("user_id").len()
    assert per_user.height == 3 and set(per_user["len"]) == {25}  # whole histories: 5 popular + 20 rare each
    assert small.items.height == 5 + 3 * 20
    assert small.notes == {"sample_kept_users": "3 of 12 (25.0%)", "sample_kept_items": "65 of 205 (31.7%)",
                           "sample_kept_interactions": "75 of 250 (30.0%)"}
    assert "trial sample kept 3 of 12 (25.0%) users" in caplog.text


def test_item_limit_passes_users_over_instead_of_cutting_histories(caplog):
    ds = _ml_like()
    with caplog.at_level("INFO"):
        small = limit_dataset(ds, limit_users=8, limit_items=8, seed=0)  # the 8 x 8 on a 20-rating dataset
    assert small.users.height == 1 and small.interactions.height == 25  # one whole history, not 34 scraps
    assert small.notes["sample_users_passed_over_for_limit_items"] == 9
    assert "alone rated 25 items, more than limit_items=8" in caplog.text


def test_most_rated_sample_keeps_every_drawn_user_and_the_popular_items():
    ds = _ml_like()
    small = limit_dataset(ds, limit_users=8, limit_items=8, seed=0, sample_items="most_rated")
    # no user is passed over: the 8 drawn users are those the whole-history sample visits first
    order = ds.interactions.group_by("user_id").agg(pl.len()).sort("user_id").sample(fraction=1.0, shuffle=True, seed=0)
    assert set(small.users["user_id"]) == set(order["user_id"].head(8))
    # the 5 popular items (rated by all 8) first, then 3 rare ones by item id; only their interactions remain
    assert small.items["item_id"].sort().to_list()[:5] == [f"pop{i}" for i in range(5)]
    assert small.items.height == 8 and set(small.interactions["item_id"]) == set(small.items["item_id"])
    assert small.interactions.height == 8 * 5 + 3
    assert small.notes["sample_dropped_interactions"] == 8 * 25 - small.interactions.height
    assert small.notes["sample_users_without_interactions"] == 0
    again = limit_dataset(ds, limit_users=8, limit_items=8, seed=0, sample_items="most_rated")
    assert_frame_equal(small.interactions, again.interactions)
    with pytest.raises(ValueError, match="sample_items"):
        limit_dataset(ds, limit_users=8, limit_items=8, sample_items="top")


def test_users_without_knowledge_are_counted(caplog):
    from pipelines.knowledge.accounting import NO_INTERACTIONS, skipped_entities

    ds = synthetic_dataset(SMALL, seed=0)
    ds.users = pl.concat([ds.users, ds.users.head(2).with_columns(user_id=pl.Series(["ghost1", "ghost2"]))])
    with caplog.at_level("WARNING"):
        skipped = skipped_entities(ds, split_old_new(ds))
    assert skipped == {NO_INTERACTIONS: 2}
    assert "2 users without interactions get no new knowledge (e.g. ['ghost1', 'ghost2'])" in caplog.text


def test_routing_warnings_reach_the_notes(caplog):
    from pipelines.knowledge.accounting import lightgcn_notes, pool_kind_notes

    with caplog.at_level("WARNING"):
        assert "learned nothing" in lightgcn_notes(0.0)["warning_lightgcn"]
        assert lightgcn_notes(0.12) == {}
        assert "not trained" in lightgcn_notes(None)["warning_lightgcn"]
        routing = pl.DataFrame({"entity_type": ["user", "user", "item"], "pool_kind": ["attribute"] * 3})
        notes = pool_kind_notes(routing, {"user": "warm_cold", "item": "attribute"})
    assert list(notes) == ["warning_user_pools"] and "every user went to the attribute pool" in notes["warning_user_pools"]
    mixed = pl.DataFrame({"entity_type": ["user", "user"], "pool_kind": ["attribute", "collaborative"]})
    assert pool_kind_notes(mixed, {"user": "warm_cold"}) == {}
    assert "learned nothing" in caplog.text
