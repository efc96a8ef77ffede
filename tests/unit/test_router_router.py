"""The binary router: policies, fallbacks with reasons, memberships, Parquet round trip, bad input."""

from __future__ import annotations

import polars as pl
import pytest

from router.router import group_memberships, interaction_counts, read_routing, route, write_routing

ATTR = pl.DataFrame({"entity_id": ["a", "b", "c", "d"], "group_id": ["Drama", "Drama", "War", "unknown"]})
COLLAB = pl.DataFrame({"entity_id": ["a", "b", "c"], "group_id": ["0", "1", "1"]})
COUNTS = {"a": 12, "b": 2, "c": 5}


def _rows(table):
    return {r["entity_id"]: (r["pool_kind"], r["group_id"]) for r in table.to_pylist()}


def test_warm_cold_default_and_fallback_without_embedding():
    counts = {**COUNTS, "d": 50}
    table = route("user", ["a", "b", "c", "d"], ATTR, COLLAB, counts, warm_threshold=5)
    assert _rows(table) == {
        "a": ("collaborative", "0"),
        "b": ("attribute", "Drama"),
        "c": ("collaborative", "1"),
        "d": ("attribute", "unknown"),
    }
    reasons = dict(zip(table["entity_id"].to_pylist(), table["reason"].to_pylist()))
    assert "no embedding" in reasons["d"] and reasons["b"].startswith("cold")
    assert set(table["entity_type"].to_pylist()) == {"user"}


def test_always_policies_and_custom_callable():
    assert {k for k, _ in _rows(route("item", list("abcd"), ATTR, COLLAB, COUNTS, policy="attribute")).values()} == {
        "attribute"
    }
    always = _rows(route("item", list("abcd"), ATTR, COLLAB, COUNTS, policy="collaborative"))
    assert always["a"] == ("collaborative", "0") and always["d"] == ("attribute", "unknown")
    custom = route(
        "item",
        list("abcd"),
        ATTR,
        COLLAB,
        COUNTS,
        policy=lambda e: ("collaborative", "war fans") if e.attribute_group == "War" else "attribute",
    )
    assert _rows(custom)["c"] == ("collaborative", "1") and _rows(custom)["a"] == ("attribute", "Drama")
    assert custom["reason"].to_pylist()[2] == "war fans"
    with pytest.raises(ValueError, match="'global'"):
        route("item", ["a"], ATTR.head(1), policy=lambda e: "global")
    with pytest.raises(ValueError, match="unknown routing policy"):
        route("item", ["a"], ATTR.head(1), policy="sometimes")


def test_bad_input_names_ids():
    with pytest.raises(ValueError, match=r"no attribute group.*'e'"):
        route("user", ["a", "e"], ATTR)
    with pytest.raises(ValueError, match=r"duplicated.*'a'"):
        route("user", ["a", "a"], ATTR)
    with pytest.raises(ValueError, match=r"more than once.*'a'"):
        route("user", ["a"], ATTR, pl.concat([COLLAB, COLLAB]))


def test_memberships_parquet_and_counts(tmp_path):
    members = group_memberships("user", ATTR, COLLAB)
    assert members.num_rows == 7
    path = write_routing(route("user", list("abcd"), ATTR, COLLAB, COUNTS), tmp_path / "r" / "routing.parquet")
    assert _rows(read_routing(path)) == _rows(route("user", list("abcd"), ATTR, COLLAB, COUNTS))
    frame = pl.DataFrame({"user_id": ["a", "a", "b"], "item_id": ["1", "2", "1"]})
    assert interaction_counts(frame, "user_id") == {"a": 2, "b": 1}
