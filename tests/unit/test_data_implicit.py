"""Implicit feedback (dataset.feedback: implicit): a table without ratings loads with one weight per
interaction (weight column x event weight), bad events are counted naming the column and value, repeats
merge, LightGCN's positives are the weighted interactions, histories say what the user did, and an explicit
dataset's source hashes and prompts are what they were before implicit feedback existed."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from pipelines.data import DatasetConfig, load_dataset, split_old_new
from pipelines.data.readers import DataFileError
from pipelines.prompts.template import shipped_template
from pipelines.knowledge.prompts import user_histories, user_prompt
from pipelines.knowledge.requests import payload_hash, request_keys
from pipelines.workers import HistoryEntry
from router.lightgcn import LightGCNConfig, build_graph, train_lightgcn

WEIGHTS = {"purchase": 3.0, "cart": 2.0, "click": 1.0, "view": 0.5}
EVENTS = pl.DataFrame(
    {
        "uid": [1, 1, 1, 1, 2, 2, 2, 3, 3],
        "item_id": ["a", "b", "a", "c", "a", "d", "e", "b", "c"],
        "action": ["view", "view", "purchase", "click", "cart", "view", "view", "purchase", "view"],
        "plays": [3, 1, 1, 2, 1, 1, 0, 1, 1],
        "ts": [100, 101, 102, 103, 104, 105, 106, 107, 108],
    }
)
ITEMS = pl.DataFrame(
    {"item_id": list("abcde"), "title": ["Kettle (2019)", "Mug", "Teapot", "Spoon", "Tray"], "genres": ["Home"] * 5}
)


def _config(root: Path, **extra) -> DatasetConfig:
    columns = {"user_id": "uid", "timestamp": "ts", "event": "action", "weight": "plays"} | extra.pop("columns", {})
    return DatasetConfig(
        format="table",
        path=str(root),
        interactions_file="events.csv",
        items_file="items.csv",
        feedback="implicit",
        columns=columns,
        **extra,
    )


@pytest.fixture
def shop(tmp_path) -> Path:
    EVENTS.write_csv(tmp_path / "events.csv")
    ITEMS.write_csv(tmp_path / "items.csv")
    return tmp_path


def test_implicit_table_loads_weights_without_a_rating_column(shop):
    ds = load_dataset(_config(shop, event_weights=WEIGHTS))
    inter = ds.interactions
    assert inter["rating"].null_count() == inter.height and inter.schema["weight"] == pl.Float64
    rows = {
        (u, i): (w, e, t)
        for u, i, w, e, t in inter.select("user_id", "item_id", "weight", "event", "timestamp").iter_rows()
    }
    # user 1 item a: viewed 3 times (3 x 0.5) then purchased (1 x 3): one interaction, weights summed, newest time,
    # the heaviest row's event
    assert rows[("1", "a")] == (4.5, "purchase", 102)
    assert rows[("1", "c")] == (2.0, "click", 103) and rows[("2", "e")] == (0.0, "view", 106)
    assert inter.height == 8 and "repeated (user, item) interactions merged" in " ".join(ds.notes)


def test_weight_or_event_alone_and_neither(shop):
    only_weight = load_dataset(_config(shop, columns={"event": None}))
    assert dict(zip(only_weight.interactions["item_id"], only_weight.interactions["weight"]))["c"] in (2.0, 1.0)
    assert only_weight.interactions["event"].null_count() == only_weight.interactions.height
    only_event = load_dataset(_config(shop, columns={"weight": None}))  # no event_weights: every event weighs 1
    one = only_event.interactions.filter(pl.col("user_id") == "1", pl.col("item_id") == "a")
    assert one["weight"].to_list() == [2.0] and one["event"].to_list() == ["purchase"]  # two rows of weight 1
    neither = load_dataset(_config(shop, columns={"weight": None, "event": None}))
    assert set(neither.interactions["weight"]) == {1.0, 2.0}  # 1 each, summed over repeats


def test_an_event_missing_from_event_weights_is_a_counted_bad_row(shop):
    weights = {k: v for k, v in WEIGHTS.items() if k != "click"}
    ds = load_dataset(_config(shop, event_weights=weights))
    note = next(v for k, v in ds.notes.items() if "not in dataset.event_weights" in k)
    key = next(k for k in ds.notes if "not in dataset.event_weights" in k)
    assert "column 'action'" in key and "'click'" in key and note == {"count": 1, "lines": [5]}
    assert ("1", "c") not in set(ds.interactions.select("user_id", "item_id").iter_rows())
    with pytest.raises(DataFileError, match=r"events.csv: 5 of 9 events in column 'action' not in .*'view'"):
        load_dataset(_config(shop, event_weights={"purchase": 3.0, "cart": 2.0, "click": 1.0}))


def test_negative_or_unreadable_weights_are_counted_bad_rows(tmp_path):
    EVENTS.with_columns(plays=pl.Series(["3", "x", "1", "-2", "1", "1", "0", "1", "1"])).write_csv(
        tmp_path / "events.csv"
    )
    ITEMS.write_csv(tmp_path / "items.csv")
    ds = load_dataset(_config(tmp_path, event_weights=WEIGHTS))
    assert any("'plays'" in k for k in ds.notes)  # "x": malformed, naming the column
    assert any("invalid weights" in k and v["count"] == 1 for k, v in ds.notes.items())  # -2 (x 1)


def test_implicit_keys_need_implicit_feedback(shop):
    with pytest.raises(ValidationError, match="columns.weight.*set dataset.feedback: implicit"):
        DatasetConfig(format="table", path=str(shop), columns={"weight": "plays"})
    with pytest.raises(ValidationError, match="event_weights needs dataset.columns.event"):
        DatasetConfig(format="table", path=str(shop), feedback="implicit", event_weights=WEIGHTS)
    with pytest.raises(ValidationError, match="rating_scale: explicit feedback only"):
        DatasetConfig(format="table", path=str(shop), feedback="implicit", rating_scale=(1, 5))


def test_a_rated_dataset_read_as_implicit_drops_its_ratings():
    ds = load_dataset(DatasetConfig(format="synthetic", feedback="implicit", synthetic={"n_users": 20, "n_items": 30}))
    assert ds.interactions["rating"].null_count() == ds.interactions.height
    assert set(ds.interactions["weight"]) == {1.0}


def test_lightgcn_positives_are_the_weighted_interactions(shop):
    inter = load_dataset(_config(shop, event_weights=WEIGHTS)).interactions
    graph = build_graph(inter, None, 0.0, 0, positive_column="weight")
    assert "e" not in graph.item_ids  # user 2 viewed e 0 times: weight 0, no positive
    assert len(graph.train) == 7
    strong = build_graph(inter, 2.0, 0.0, 0, positive_column="weight")  # min_positive_weight: 2
    assert len(strong.train) == 4
    result = train_lightgcn(
        inter,
        LightGCNConfig(
            embedding_dim=4,
            max_epochs=2,
            eval_every=1,
            positive_threshold=None,
            positive_column="weight",
            progress=False,
        ),
    )
    assert sorted(result.users.ids) == ["1", "2", "3"] and "e" not in result.items.ids
    with pytest.raises(ValueError, match="no interaction has weight >= 9"):
        build_graph(inter, 9.0, 0.0, 0, positive_column="weight")


def test_implicit_histories_say_what_the_user_did(shop):
    ds = load_dataset(_config(shop, event_weights=WEIGHTS))
    history = user_histories(ds.interactions, ds.items)["1"]
    assert history[1] == HistoryEntry("Kettle (2019)", None, ("Home",), "purchase", 4.5)
    for domain in ("movie", "book", "ecommerce"):
        text = user_prompt(history, template=shipped_template(domain), max_words=50)
        assert "rating" not in text.lower() and "dislike" not in text, domain
        assert "Action: viewed (weight 0.5)" in text and "Action: purchased (weight 4.5)" in text, domain
    assert "1. Product: Mug | Categories: Home | Action: viewed (weight 0.5)\n" in user_prompt(
        history, template=shipped_template("ecommerce"), max_words=50
    )
    plain = user_prompt([HistoryEntry("Mug", None, (), None, 1.0)], max_words=50)
    assert "1. Title: Mug | Action: interacted with\n" in plain  # no event, weight 1: nothing more to say


def test_explicit_prompts_unchanged():
    """The e-commerce explicit prompt as the template rendered it before implicit feedback (movie and book:
    tests/unit/test_prompt_templates.py's frozen prompts)."""
    history = [HistoryEntry("Kettle (2019)", 4.0, ("Home", "Kitchen")), HistoryEntry("Mug", 2.5)]
    assert user_prompt(history, template=shipped_template("ecommerce"), max_words=50) == (
        "A shopper's rated purchases, oldest first (rating 1 = disliked, 5 = loved):\n"
        "1. Product: Kettle (2019) | Categories: Home, Kitchen | Rating: 4\n2. Product: Mug | Rating: 2.5\n\n"
        "In 2 or 3 short sentences (at most 50 words in all), describe this shopper's tastes: the kinds of "
        'products they like and the ones they dislike. Use only the facts listed above. Begin with "This user enjoys".'
    )


# computed before implicit feedback existed: an explicit dataset's hashes must not move (a scheduled team's
# next run would regenerate everything)
EXPLICIT_HASHES = {
    "a": "479672d275e5f62c",
    "b": "ef95011baab3534f",
    "c": "907b1c9fe4f40b17",
    "d": "28fa142f85c6090f",
    "e": "998d8cd4d24a6ee7",
    "1": "f83fdcd03b42999d",
    "2": "fe8b9267b7f7bb30",
    "3": "e4f8a1c550bd4853",
}


def test_explicit_source_hashes_unchanged(tmp_path):
    pl.DataFrame(
        {
            "user_id": [1, 1, 1, 2, 2, 3, 3, 3],
            "item_id": ["a", "b", "c", "a", "d", "b", "c", "e"],
            "rating": [5, 3, 4, 2, 5, 4, 5, 1],
            "ts": [100 + i for i in range(8)],
        }
    ).write_csv(tmp_path / "events.csv")
    pl.DataFrame(
        {
            "item_id": ["a", "b", "c", "d", "e"],
            "title": ["Kettle (1999)", "Mug", "Teapot", "Spoon", "Tray"],
            "genres": ["kitchen|tea", "kitchen", "kitchen|tea", "cutlery", "kitchen"],
        }
    ).write_csv(tmp_path / "items.csv")
    cfg = DatasetConfig(
        format="table",
        path=str(tmp_path),
        interactions_file="events.csv",
        items_file="items.csv",
        columns={"timestamp": "ts"},
    )
    ds = load_dataset(cfg)
    keys = request_keys(ds, split_old_new(ds, mode="latest", max_hist=30))
    assert dict(zip(keys["entity_id"], keys["source_hash"])) == EXPLICIT_HASHES
    entries = [HistoryEntry("Heat (1995)", 4.0, ("Action", "Crime")), HistoryEntry("Toy Story", 1.5)]
    assert payload_hash("user", entries) == "ec4f552ad7fb3e9c"


def test_an_event_or_weight_change_changes_the_hash(shop):
    def hashes(events: pl.DataFrame) -> dict[str, str]:
        events.write_csv(shop / "events.csv")
        ds = load_dataset(_config(shop, event_weights=WEIGHTS))
        keys = request_keys(ds, split_old_new(ds, mode="latest", max_hist=30)).filter(pl.col("entity_type") == "user")
        return dict(zip(keys["entity_id"], keys["source_hash"]))

    base = hashes(EVENTS)
    event = hashes(EVENTS.with_columns(action=pl.Series(["view"] * 8 + ["cart"])))  # user 3's last: view -> cart
    weight = hashes(EVENTS.with_columns(plays=pl.Series([3, 1, 1, 2, 1, 1, 4, 1, 1])))  # user 2's e: 0 -> 4 views
    assert event["3"] != base["3"] and weight["2"] != base["2"]
    assert weight["1"] == base["1"] and weight["3"] == base["3"]
