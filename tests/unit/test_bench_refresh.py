"""`laser bench refresh`'s day 2 edit and its quality figures (benchmarks/refresh.py)."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.data.schema import INTERACTIONS_SCHEMA
from benchmarks.refresh import day_two, text_quality


def test_day_two_adds_one_unseen_interaction_per_heavy_user_and_one_item(tmp_path):
    rows = [(f"u{u}", f"i{i}", 4.0, 100 * u + i) for u in range(4) for i in range(3 + 3 * u)]
    pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row").write_parquet(tmp_path / "interactions.parquet")
    pl.DataFrame({"item_id": [f"i{i}" for i in range(14)], "title": [f"T{i}" for i in range(14)]}).write_parquet(
        tmp_path / "items.parquet"
    )
    users, item = day_two(tmp_path, users=2, min_history=9, seed=0)
    assert users == ["u2", "u3"]  # the only users with 9+ interactions
    inter = pl.read_parquet(tmp_path / "interactions.parquet")
    added = inter.filter(pl.col("timestamp") > 400)
    assert sorted(added["user_id"].to_list()) == users
    for user, got in zip(added["user_id"], added["item_id"]):  # an item the user had not seen
        assert inter.filter((pl.col("user_id") == user) & (pl.col("item_id") == got)).height == 1
    items = pl.read_parquet(tmp_path / "items.parquet")
    assert items.height == 15 and item in items["item_id"].to_list()
    with pytest.raises(RuntimeError, match="only 0 users"):
        day_two(tmp_path, users=1, min_history=50, seed=0)


def test_text_quality_reads_the_quality_columns():
    rows = pl.DataFrame({"ended": [True, False], "degenerate": [False, False], "grounding": [1.0, None]})
    assert text_quality(rows) == {"rows": 2, "ended_share": 0.5, "degenerate_share": 0.0, "grounding": 1.0}
