"""Bad input one row at a time: the row is skipped and counted in the load report (``Dataset.notes``) with its
file and line, or the load stops with one line naming the file and the column; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipelines.data import DatasetConfig, load_dataset
from pipelines.data.readers import DataFileError

INTER = "user_id,item_id,rating,timestamp\nu1,a,4,1\nu1,b,4,2\nu2,a,3,3\nu2,c,5,4\n"


def _table(tmp_path: Path, items: str | None = None, inter: str = INTER, **cfg) -> DatasetConfig:
    (tmp_path / "inter.csv").write_text(inter)
    if items is not None:
        (tmp_path / "items.csv").write_text(items)
        cfg.setdefault("items_file", "items.csv")
    return DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.csv", **cfg)


def test_item_row_with_an_empty_id_is_skipped_and_counted(tmp_path):
    ds = load_dataset(_table(tmp_path, "item_id,title\na,Alpha\n,Nobody\nb,Beta\n  ,Blank\nc,Gamma\n"))
    assert ds.items["item_id"].to_list() == ["a", "b", "c"]  # never an item None
    assert ds.items["item_id"].null_count() == 0
    assert ds.notes["items.csv: rows with an empty 'item_id', skipped"] == {"count": 2, "lines": [3, 5]}
    assert ds.interactions.height == 4


def test_user_and_interaction_rows_without_ids_name_file_column_and_line(tmp_path):
    pl.DataFrame({"uid": ["u1", None, "u2"], "age": [30, 40, 50]}).write_parquet(tmp_path / "users.parquet")
    inter = "uid,item_id,rating,timestamp\nu1,a,4,1\n,b,4,2\nu2,a,3,3\nu2,c,5,4\n"
    ds = load_dataset(
        _table(
            tmp_path, "item_id,title\na,A\nb,B\nc,C\n", inter, users_file="users.parquet", columns={"user_id": "uid"}
        )
    )
    assert ds.users["user_id"].to_list() == ["u1", "u2"]
    assert ds.notes["users.parquet: rows with an empty user_id (column 'uid'), skipped"] == {"count": 1, "lines": [2]}
    assert ds.notes["inter.csv: malformed rows (empty or invalid 'uid'), skipped"] == {"count": 1, "lines": [3]}


def test_no_usable_id_stops_with_one_line_naming_file_and_column(tmp_path):
    with pytest.raises(
        DataFileError,
        match=r"items\.csv: column 'item_id': 2 of 3 rows have no item_id \(first at "
        r"line 2, 4\)",
    ):
        load_dataset(_table(tmp_path, "item_id,title\n,A\na,B\n ,C\n"))


def test_bad_json_line_is_skipped_and_counted_and_ids_are_text_whatever_their_type(tmp_path):
    lines = [
        json.dumps({"user_id": 1, "item_id": 10, "rating": 4, "timestamp": 1}),
        "{not json",
        json.dumps({"user_id": "1", "item_id": "11", "rating": 5, "timestamp": 2}),
        json.dumps({"user_id": 2.0, "item_id": " 10 ", "rating": 3, "timestamp": 3}),
    ]
    (tmp_path / "inter.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "items.jsonl").write_text(
        json.dumps({"item_id": 10, "title": "Ten"}) + "\n" + json.dumps({"item_id": "11", "title": "Eleven"}) + "\n"
    )
    ds = load_dataset(
        DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.jsonl", items_file="items.jsonl")
    )
    assert sorted(ds.interactions.select("user_id", "item_id").rows()) == [("1", "10"), ("1", "11"), ("2", "10")]
    assert ds.notes == {"inter.jsonl: lines that are not a JSON object, skipped": {"count": 1, "lines": [2]}}


def test_integer_ids_in_one_file_match_text_ids_in_another(tmp_path):
    # an integer column with a gap is written as floats (10.0) by pandas; the items file types them as text
    pl.DataFrame(
        {"user_id": [1, 1, 2], "item_id": [10.0, None, 20.0], "rating": [4, 5, 3], "timestamp": [1, 2, 3]}
    ).write_parquet(tmp_path / "inter.parquet")
    (tmp_path / "items.csv").write_text("item_id,title\n10,Ten\n20,Twenty\n")
    ds = load_dataset(
        DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.parquet", items_file="items.csv")
    )
    assert sorted(ds.interactions.select("user_id", "item_id").rows()) == [("1", "10"), ("2", "20")]
    assert ds.notes == {
        "inter.parquet: malformed rows (empty or invalid 'item_id'), skipped": {"count": 1, "lines": [2]}
    }


def test_unbalanced_quote_skips_that_row_only(tmp_path):
    ds = load_dataset(_table(tmp_path, 'item_id,title\na,Alpha\nb,"Beta\nc,"Gamma, The"\n'))
    assert dict(ds.items.select("item_id", "title").rows()) == {"a": "Alpha", "c": "Gamma, The"}
    assert ds.notes["items.csv: rows with an unbalanced quote, skipped"] == {"count": 1, "lines": [3]}
    assert ds.notes["inter.csv: interactions with items missing from the items file, skipped"]["lines"] == [3]


def test_list_typed_category_is_read_as_a_category_path(tmp_path):
    lines = [
        {"item_id": "a", "title": "A", "category": ["Books", "Mystery"]},
        {"item_id": "b", "title": "B", "category": "Cooking"},
        {"item_id": "c", "title": "C", "category": ["Travel"], "sub_category": "Europe"},
    ]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    ds = load_dataset(_table(tmp_path, items_file="items.jsonl"))
    got = {r["item_id"]: (r["category"], r["sub_category"]) for r in ds.items.iter_rows(named=True)}
    assert got == {"a": ("Books", "Mystery"), "b": ("Cooking", None), "c": ("Travel", "Europe")}
    assert ds.notes[
        "items.jsonl: items whose category (column 'category') is a list: the first entry is the "
        "category, the second the sub-category"
    ] == {"count": 3, "lines": [1, 2, 3]}


def test_missing_or_list_typed_title_column_stops_naming_file_and_column(tmp_path):
    with pytest.raises(DataFileError, match=r"items\.csv: missing title \(column 'name'\)"):
        load_dataset(_table(tmp_path, "item_id,title\na,A\n", columns={"title": "name"}))
    pl.DataFrame({"item_id": ["a"], "title": [["A", "B"]]}).write_parquet(tmp_path / "items.parquet")
    with pytest.raises(DataFileError, match=r"items\.parquet: column 'title' holds List\(String\) values, not one"):
        load_dataset(_table(tmp_path, items_file="items.parquet"))


def test_ids_matching_no_item_stop_naming_the_column(tmp_path):
    with pytest.raises(DataFileError, match=r"inter\.csv: column 'item_id': none of the 4 interactions names an item"):
        load_dataset(_table(tmp_path, "item_id,title\nx,X\ny,Y\n"))


def test_amazon_bad_lines_are_counted_by_file_and_line(tmp_path):
    reviews = [
        json.dumps({"reviewerID": "A1", "asin": "B1", "overall": 5, "unixReviewTime": 1}),
        "{torn",
        json.dumps({"reviewerID": "", "asin": "B1", "overall": 4, "unixReviewTime": 2}),
        json.dumps({"reviewerID": "A2", "asin": 7.0, "overall": 4, "unixReviewTime": 3}),
    ]
    (tmp_path / "reviews.json").write_text("\n".join(reviews) + "\n")
    (tmp_path / "meta.json").write_text(
        json.dumps({"asin": "B1", "title": "One", "category": "Books"})
        + "\n"
        + json.dumps({"asin": 7, "title": "Seven"})
        + "\n"
    )
    ds = load_dataset(
        DatasetConfig(format="amazon", path=str(tmp_path), reviews_file="reviews.json", metadata_file="meta.json")
    )
    assert sorted(ds.interactions["item_id"].to_list()) == ["7", "B1"]
    assert ds.notes == {
        "reviews.json: lines that are not a JSON object, skipped": {"count": 1, "lines": [2]},
        "reviews.json: records without a user, item, numeric rating or timestamp, skipped": {"count": 1, "lines": [3]},
    }
    assert ds.items.filter(pl.col("item_id") == "B1")["category"].to_list() == ["Books"]


def test_movielens_bad_lines_reach_the_load_report(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::10::5::978300760\n::20::3::978302109\n2::20::4::978300000\n")
    (tmp_path / "movies.dat").write_text("10::Toy Story (1995)::Comedy\n20::Heat (1995)::Action\n")
    ds = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))
    assert ds.interactions.height == 2
    ((key, value),) = ds.notes.items()
    assert key.startswith("ratings.dat: malformed lines") and value == {"count": 1, "lines": [2]}
