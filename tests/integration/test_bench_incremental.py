"""`laser bench incremental`: the choice of changed users and the edit of their data (no model, no Ray)."""

from __future__ import annotations

import polars as pl

from benchmarks.incremental import edit_users, pick_users


def test_pick_users_is_a_seeded_share_of_the_users_with_knowledge():
    frame = pl.DataFrame(
        {
            "entity_type": ["user"] * 20 + ["item"] * 5,
            "entity_id": [f"u{i}" for i in range(20)] + [f"i{i}" for i in range(5)],
        }
    )
    picked = pick_users(frame, 0.1, seed=0)
    assert len(picked) == 2 and set(picked) <= {f"u{i}" for i in range(20)}
    assert pick_users(frame, 0.1, seed=0) == picked and pick_users(frame, 0.01, seed=0) != []  # at least one


def test_edit_users_flips_only_the_newest_rating_of_the_listed_users(tmp_path):
    inter = pl.DataFrame(
        {
            "user_id": ["a", "a", "b", "b"],
            "item_id": ["x", "y", "x", "y"],
            "rating": [4.0, 5.0, 2.0, 4.0],
            "timestamp": [1, 2, 1, 2],
        }
    )
    inter.write_parquet(tmp_path / "interactions.parquet")
    edit_users(tmp_path, ["a"])
    out = pl.read_parquet(tmp_path / "interactions.parquet")
    assert out["rating"].to_list() == [4.0, 1.0, 2.0, 4.0]  # a's newest: high -> 1; b untouched
    assert out["timestamp"].to_list() == inter["timestamp"].to_list()  # in place: the watermark cannot see it
