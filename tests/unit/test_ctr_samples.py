"""CTR samples, the by-user split and tensorisation, on hand-computable histories."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import polars as pl
import pytest
import torch

from pipelines.ctr.features import ItemCatalog, KnowledgeVectors, to_tensors
from pipelines.ctr.samples import build_samples, split_by_user

SCHEMA = {"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64, "timestamp": pl.Int64}


def _frame(rows):
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def test_samples_take_new_part_label_and_last_history_before_target():
    old = _frame([("a", f"i{k}", float(k), 10 + k) for k in range(1, 5)])  # i1..i4 rated 1..4
    new = _frame([("a", "i6", 5.0, 30), ("a", "i5", 3.5, 20), ("b", "i1", 4.0, 5)])
    s = build_samples(old, new, rating_threshold=4.0, history_len=3)
    assert s["user_id"].to_list() == ["a", "a", "b"]
    assert s["item_id"].to_list() == ["i5", "i6", "i1"]  # time order, only new interactions
    assert s["label"].to_list() == [0, 1, 1]  # 3.5 < 4 <= 5, 4
    assert s["hist_items"].to_list() == [["i2", "i3", "i4"], ["i3", "i4", "i5"], []]
    assert s["hist_ratings"].to_list() == [[2.0, 3.0, 4.0], [3.0, 4.0, 3.5], []]


def test_split_by_user_is_disjoint_complete_and_seeded():
    s = pl.DataFrame({"user_id": [f"u{k % 20}" for k in range(60)], "x": list(range(60))})
    parts = split_by_user(s, seed=0)
    users = {k: set(v["user_id"].to_list()) for k, v in parts.items()}
    assert [len(users[k]) for k in ("train", "val", "test")] == [16, 2, 2]
    assert (
        not (users["train"] & users["val"])
        and not (users["train"] & users["test"])
        and not (users["val"] & users["test"])
    )
    assert sum(v.height for v in parts.values()) == 60
    assert split_by_user(s, seed=0)["test"].equals(parts["test"])
    assert set(split_by_user(s, seed=1)["test"]["user_id"].to_list()) != users["test"]
    with pytest.raises(ValueError, match="summing to 1"):
        split_by_user(s, seed=0, fractions=(0.5, 0.2, 0.2))


def test_tensors_right_align_history_and_flag_missing_knowledge():
    items = pl.DataFrame({"item_id": ["i1", "i2"], "category": ["Drama", None], "genres": [["Drama", "War"], []]})
    catalog = ItemCatalog.build(items, extra_item_ids=["i9"])
    assert catalog.index == {"i1": 1, "i2": 2, "i9": 3}
    assert catalog.category.tolist() == [0, 1, 0, 0]
    assert catalog.genres.tolist() == [[0, 0, 0], [1, 2, 0], [0, 0, 0], [0, 0, 0]]
    samples = pl.DataFrame(
        {
            "user_id": ["a", "b"],
            "item_id": ["i2", "zz"],
            "label": [1, 0],
            "hist_items": [["i9", "i1"], []],
            "hist_ratings": [[2.0, 4.5], []],
        },
        schema_overrides={"label": pl.Int8},
    )
    kv = KnowledgeVectors.from_frame(
        pl.DataFrame({"entity_type": ["user", "item"], "entity_id": ["a", "i2"], "vector": [[1.0, 2.0], [3.0, 4.0]]})
    )
    t = to_tensors(samples, catalog, kv, history_len=3)
    assert t.target.tolist() == [2, 0]  # unknown item -> 0
    assert t.hist.tolist() == [[0, 3, 1], [0, 0, 0]]
    assert t.hist_rating.tolist() == [[0.0, 2.0, 4.5], [0.0, 0.0, 0.0]]
    assert t.user_vec.tolist() == [[1.0, 2.0], [0.0, 0.0]] and t.user_has.tolist() == [1.0, 0.0]
    assert t.item_vec.tolist() == [[3.0, 4.0], [0.0, 0.0]] and t.item_has.tolist() == [1.0, 0.0]
    sub = t.take(torch.tensor([1]))
    assert sub.user_ids.tolist() == ["b"] and sub.label.tolist() == [0.0]
    assert np.array_equal(to_tensors(samples, catalog).user_ids, np.array(["a", "b"], dtype=object))
    assert to_tensors(samples, catalog).user_vec is None


IMPLICIT = {**SCHEMA, "weight": pl.Float64, "event": pl.Utf8}


def _implicit(rows):
    """(user, item, timestamp, weight) rows as canonical implicit interactions (rating null)."""
    return pl.DataFrame([(u, i, None, t, w, None) for u, i, t, w in rows], schema=IMPLICIT, orient="row")


def _random_interactions(seed: int, n_users: int = 12, n_items: int = 30, implicit: bool = False) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for t, i in enumerate(rng.choice(n_items, size=int(rng.integers(3, 10)), replace=False)):
            rows.append((f"u{u}", f"i{i}", float(rng.integers(0, 4)) if implicit else float(rng.integers(1, 6)), t))
    if implicit:
        return _implicit([(u, i, t, w) for u, i, w, t in rows])
    return _frame(rows)


def _halves(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    return frame.filter(pl.col("timestamp") < 3), frame.filter(pl.col("timestamp") >= 3)


def test_explicit_samples_are_pinned_and_ignore_the_implicit_arguments():
    old, new = _halves(_random_interactions(7))
    s = build_samples(old, new, rating_threshold=4.0, history_len=3)
    digest = hashlib.sha256(json.dumps([str(s.schema), s.to_dicts()]).encode()).hexdigest()
    assert s.height == new.height
    assert digest == "cdd6f422cc767c9b5f95524e2fde3d444f02819a833a855c7707f943ce0c1f48"  # as before implicit feedback
    same = build_samples(old, new, 4.0, 3, negatives=9, seed=5, min_positive_weight=2.0, seen=old)
    assert same.equals(s)


def test_implicit_positives_get_seeded_negatives_the_user_never_touched():
    every = _random_interactions(3, implicit=True)
    old, new = _halves(every)
    k = 4
    s = build_samples(old, new, history_len=3, negatives=k, seed=11)
    positives = new.filter(pl.col("weight") > 0).height
    assert s.height == new.height + k * positives
    assert s["label"].sum() == positives and set(s["label"].to_list()) == {0, 1}
    observed = s.join(new.select("user_id", "item_id"), on=["user_id", "item_id"], how="semi")
    assert observed.height == new.height  # the observed rows, weight-0 ones labelled 0 without negatives
    assert observed.filter(pl.col("label") == 0).height == new.height - positives
    fakes = s.join(new.select("user_id", "item_id"), on=["user_id", "item_id"], how="anti")
    assert fakes.height == k * positives and fakes["label"].to_list() == [0] * fakes.height
    assert fakes.join(every, on=["user_id", "item_id"], how="semi").height == 0
    assert set(fakes["item_id"].to_list()) <= set(every["item_id"].to_list())
    # each positive is followed by its negatives, which share its user and history (weights, not ratings)
    labels = s["label"].to_list()
    first = labels.index(1)
    rows = s.slice(first, k + 1).to_dicts()
    assert [r["label"] for r in rows] == [1] + [0] * k
    assert all(r["hist_items"] == rows[0]["hist_items"] and r["user_id"] == rows[0]["user_id"] for r in rows)
    weights = dict(zip(zip(every["user_id"], every["item_id"]), every["weight"]))
    assert rows[0]["hist_ratings"] == [weights[(rows[0]["user_id"], i)] for i in rows[0]["hist_items"]]
    again = build_samples(old, new, history_len=3, negatives=k, seed=11)
    assert again.equals(s)
    assert not build_samples(old, new, history_len=3, negatives=k, seed=12).equals(s)


def test_implicit_labels_follow_min_positive_weight_and_seen():
    old = _implicit([("a", "i1", 1, 1.0), ("b", "i2", 1, 1.0), ("b", "i3", 2, 1.0), ("c", "i4", 1, 1.0)])
    new = _implicit([("a", "i2", 2, 3.0), ("a", "i3", 3, 1.0)])
    s = build_samples(old, new, negatives=2, min_positive_weight=2.0)
    assert s.filter(pl.col("item_id").is_in(["i2", "i3"]))["label"].to_list() == [1, 0]
    assert s.height == 4 and set(s["item_id"].to_list()[1:3]) == {"i4"}  # i1..i3 are a's
    seen = pl.concat([old, new, _implicit([("a", "i4", 9, 1.0)])])
    with_all = build_samples(old, new, negatives=2, min_positive_weight=2.0, seen=seen)
    assert with_all["item_id"].to_list() == ["i2", "i3"]  # a touched every item: its slots are dropped


def test_heavy_user_negatives_fall_back_to_an_exact_draw_of_untouched_items():
    crowd = [(f"u{u}", f"i{i}", i, 1.0) for u in range(40) for i in range(9)]  # i0..i8 are popular
    old = _implicit([*crowd, ("z", "i9", 1, 1.0)] + [("a", f"i{i}", i, 1.0) for i in range(8)])
    new = _implicit([("a", "i8", 20, 1.0)])
    s = build_samples(old, new, negatives=3, seed=0)
    assert s["item_id"].to_list() == ["i8", "i9", "i9", "i9"]  # i9: the one item a never touched
    assert s["label"].to_list() == [1, 0, 0, 0]
