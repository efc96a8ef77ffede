"""Collaborative (K-means) and attribute groups: sizes, coverage, rules, determinism, bad input."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from router.embeddings import EmbeddingError, Embeddings, load_embeddings
from router.groups import AttributeGrouping, attribute_groups, collaborative_groups


def _items(n: int = 300, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    genres = [["Drama", "War"], ["Comedy"], ["Action", "Drama"], [], None]
    return pl.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(n)],
            "genres": [genres[g] for g in rng.choice(5, n, p=[0.5, 0.2, 0.2, 0.05, 0.05])],
            "year": [None if k % 17 == 0 else int(y) for k, y in enumerate(rng.integers(1950, 2010, n))],
            "category": rng.choice(["a", "b"], n).tolist(),
        }
    )


def test_attribute_groups_cover_every_entity_once_and_respect_max_size():
    items = _items()
    config = AttributeGrouping(["genres", "year", "category"], max_group_size=25, bucket_widths={"year": 10})
    groups = attribute_groups(items, config, "item_id")
    assert sorted(groups["entity_id"].to_list()) == sorted(items["item_id"].to_list())
    assert groups.group_by("group_id").len()["len"].max() <= 25
    assert groups.equals(attribute_groups(items, config, "item_id"))


def test_attribute_rules_first_genre_buckets_and_fallback():
    items = pl.DataFrame(
        {
            "item_id": ["a", "b", "c", "d", "e"],
            "genres": [["Drama", "War"], ["War"], [], None, ["Drama"]],
            "year": [1994, 1999, 2001, 1980, None],
        }
    )
    groups = attribute_groups(
        items, AttributeGrouping(["genres", "year"], max_group_size=1, bucket_widths={"year": 10}), "item_id"
    )
    got = dict(groups.iter_rows())
    assert got == {
        "a": "Drama|1990-1999",
        "e": "Drama|unknown",
        "b": "War",
        "c": "unknown|2000-2009",
        "d": "unknown|1980-1989",
    }


def test_oversized_group_without_attributes_left_is_cut_into_seeded_parts():
    items = pl.DataFrame({"item_id": [str(k) for k in range(10)], "category": ["x"] * 10})
    groups = attribute_groups(items, AttributeGrouping(["category"], max_group_size=4, seed=1), "item_id")
    sizes = sorted(groups.group_by("group_id").len()["len"].to_list())
    assert sizes == [3, 3, 4]
    assert set(groups["group_id"]) == {"x#0", "x#1", "x#2"}


def test_decision_tree_picks_the_predictive_attribute():
    n = 200
    rng = np.random.default_rng(0)
    label = rng.integers(0, 2, n)
    items = pl.DataFrame(
        {
            "item_id": [str(k) for k in range(n)],
            "category": ["c"] * n,
            "noise": rng.choice(["p", "q", "r"], n).tolist(),
            "decade": np.where(label == 1, "1990s", "1970s").tolist(),
            "cluster": label.tolist(),
        }
    )
    by_tree = AttributeGrouping(["category", "noise", "decade"], max_group_size=150, split_target="cluster")
    groups = attribute_groups(items, by_tree, "item_id")
    assert set(groups["group_id"]) == {"c|1970s", "c|1990s"}
    by_order = attribute_groups(
        items, AttributeGrouping(["category", "noise", "decade"], max_group_size=150), "item_id"
    )
    assert {g.split("|")[1] for g in by_order["group_id"]} == {"p", "q", "r"}


def test_attribute_bad_input():
    items = pl.DataFrame({"item_id": ["a", "a"], "category": ["x", "y"]})
    with pytest.raises(ValueError, match="duplicate.*'a'"):
        attribute_groups(items, AttributeGrouping(["category"]), "item_id")
    with pytest.raises(ValueError, match="sub_category"):
        attribute_groups(items, AttributeGrouping(["sub_category"]), "item_id")


def test_collaborative_groups_from_target_size_and_seed():
    rng = np.random.default_rng(0)
    centres = np.array([[5.0, 0], [0, 5.0], [-5.0, -5.0]])
    vectors = np.concatenate([c + rng.normal(0, 0.3, (20, 2)) for c in centres])
    emb = Embeddings([f"u{k}" for k in range(60)], vectors)
    groups = collaborative_groups(emb, target_group_size=20, seed=4)
    assert groups["group_id"].n_unique() == 3
    assert groups.group_by("group_id").len()["len"].to_list() == [20, 20, 20]
    assert groups.equals(collaborative_groups(emb, target_group_size=20, seed=4))
    mini = collaborative_groups(emb, n_clusters=3, seed=4, minibatch_above=10)
    assert sorted(mini.group_by("group_id").len()["len"].to_list()) == [20, 20, 20]
    # given both, the larger count: n_clusters until groups would pass the target size
    assert collaborative_groups(emb, n_clusters=2, target_group_size=20)["group_id"].n_unique() == 3
    assert collaborative_groups(emb, n_clusters=5, target_group_size=20)["group_id"].n_unique() == 5
    with pytest.raises(ValueError, match="give n_clusters"):
        collaborative_groups(emb)


def test_embeddings_validation_names_ids():
    with pytest.raises(EmbeddingError, match="'x'"):
        Embeddings(["x", "y", "x"], np.zeros((3, 2)))
    with pytest.raises(EmbeddingError, match="'y'"):
        Embeddings(["x", "y"], np.array([[0.0, 1.0], [np.nan, 1.0]]))
    with pytest.raises(EmbeddingError, match="'q'"):
        Embeddings(["x"], np.zeros((1, 2))).subset(["q"])


def test_load_embeddings_from_parquet(tmp_path):
    path = tmp_path / "emb.parquet"
    pq.write_table(
        pa.table({"id": [1, 2], "embedding": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32(), 2))}), path
    )
    emb = load_embeddings(path)
    assert emb.ids == ["1", "2"] and emb.vectors.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "embedding": [[1.0, 2.0], [3.0], [1.0, 1.0]]}), path)
    with pytest.raises(EmbeddingError, match=r"width 2.*'b'"):
        load_embeddings(path)
    with pytest.raises(EmbeddingError, match="'vec'"):
        load_embeddings(path, vector_column="vec")
    pq.write_table(pa.table({"id": ["a", "a"], "embedding": [[1.0], [2.0]]}), path)
    with pytest.raises(EmbeddingError, match=r"emb.parquet.*duplicate.*'a'"):
        load_embeddings(path)
