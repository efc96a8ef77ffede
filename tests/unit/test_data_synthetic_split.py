"""Synthetic demo data, seeded trial limits and the paper's old/new split."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipelines.data import Dataset, DatasetConfig, SyntheticParams, load_dataset, split_old_new
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
    rated = (
        ds.interactions.join(truth, on="user_id")
        .join(ds.items.select("item_id", "category"), on="item_id")
        .with_columns(liked=pl.col("liked_genres").list.contains(pl.col("category")))
    )
    means = dict(rated.group_by("liked").agg(pl.col("rating").mean()).rows())
    assert means[True] > 4.0 and means[False] < 3.3
    share = rated.filter(
        pl.col("user_id").is_in(
            ds.interactions.group_by("user_id").len().filter(pl.col("len") > 3)["user_id"].implode()
        )
    )["liked"].mean()
    assert share > 0.45  # by chance (2-3 liked of 16 genres) about 0.16; below 0.75 as picks exhaust small clusters


def _tiny() -> Dataset:
    """u1: 5 interactions, u2: 2, u3: 1, u4: 8 (two share a timestamp: item_id breaks the tie)."""
    rows = (
        [("u1", f"a{k}", 4.0, 100 - k) for k in range(5)]  # reverse time order on input
        + [("u2", "b0", 3.0, 10), ("u2", "b1", 5.0, 5)]
        + [("u3", "c0", 2.0, 1)]
        + [("u4", f"d{k}", 1.0, 50 + k // 2 * 2) for k in range(8)]
    )
    inter = pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row")
    ids = sorted(inter["item_id"].unique().to_list())
    items = pl.DataFrame(
        {
            "item_id": ids,
            "title": ids,
            "genres": [[i[0]] for i in ids],
            "category": [i[0] for i in ids],
            "sub_category": [None] * len(ids),
            "year": [None] * len(ids),
        },
        schema=ITEM_COLUMNS,
    )
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


def test_item_split_is_deterministic_and_stable_per_item():
    ds = synthetic_dataset(SMALL, seed=5)
    a, b = split_old_new(ds, seed=1), split_old_new(ds, seed=1)
    assert_frame_equal(a.new_items, b.new_items)
    assert not split_old_new(ds, seed=2).new_items.equals(a.new_items)
    existing, new = set(a.existing_items["item_id"]), set(a.new_items["item_id"])
    assert not existing & new and existing | new == set(ds.items["item_id"])
    assert 0.3 < len(new) / ds.items.height < 0.7  # about the fraction asked (0.5)
    assert split_old_new(ds, new_item_fraction=0.0).new_items.is_empty()
    assert split_old_new(ds, new_item_fraction=1.0).existing_items.is_empty()
    # one more item in a category never re-draws the others (one shared RNG draw per category did)
    extra = ds.items.head(1).with_columns(item_id=pl.lit("added-item"))
    grown = split_old_new(Dataset(ds.name, ds.domain, ds.interactions, pl.concat([ds.items, extra]), ds.users), seed=1)
    assert set(grown.new_items["item_id"]) - {"added-item"} == new


# trial samples (limit_dataset): tests/unit/test_data_trial_sample.py


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
    assert (
        list(notes) == ["warning_user_pools"] and "every user went to the attribute pool" in notes["warning_user_pools"]
    )
    mixed = pl.DataFrame({"entity_type": ["user", "user"], "pool_kind": ["attribute", "collaborative"]})
    assert pool_kind_notes(mixed, {"user": "warm_cold"}) == {}
    assert "learned nothing" in caplog.text


def test_latest_mode_prompts_show_each_users_newest_interactions():
    """A heavy user's knowledge comes from their latest max_hist interactions, so one more interaction
    always changes what the prompt shows (the paper split left it out past 2 * max_hist - 1)."""
    rows = [("heavy", f"i{t}", 4.0, t) for t in range(9)] + [("light", "i0", 3.0, 5)]  # light: fewer than max_hist
    inter = pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row")
    items = pl.DataFrame({"item_id": [f"i{t}" for t in range(10)], "title": [f"T{t}" for t in range(10)]})
    ds = Dataset("t", "movie", inter, items, pl.DataFrame({"user_id": ["heavy", "light"]}))
    split = split_old_new(ds, max_hist=2, mode="latest")
    shown = split.prompt_interactions.filter(pl.col("user_id") == "heavy")["item_id"].to_list()
    assert shown == ["i7", "i8"]  # the newest two; the paper split shows i0-i3 then new i4, i5
    assert split.routing_interactions.height == inter.height  # routing learns from every interaction
    assert split.existing_items.is_empty() and split.new_items.height == items.height
    assert split.prompt_interactions.filter(pl.col("user_id") == "light").height == 1
    paper = split_old_new(ds, max_hist=2, mode="paper")
    assert "i8" not in paper.prompt_interactions.filter(pl.col("user_id") == "heavy")["item_id"].to_list()
