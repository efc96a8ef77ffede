"""CTR samples, the by-user split and tensorisation, on hand-computable histories."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from pipelines.ctr import ItemCatalog, KnowledgeVectors, build_samples, split_by_user, to_tensors

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
