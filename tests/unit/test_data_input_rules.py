"""Input that used to be accepted silently is skipped or repaired by rule and counted in the load report
(``Dataset.notes``) with file line numbers (the header is line 1)."""
from __future__ import annotations

from pathlib import Path

from pipelines.data import DatasetConfig, load_dataset

RATINGS = ("userId,movieId,rating,timestamp\n"
           "1,10,4.0,964982703\n"
           "1,20,4.5,964981247,surprise\n"      # line 3: an extra column
           "2,10,3.0,964982224\n"
           "2,99,5.0,964982225\n"                # line 5: item 99 is not in movies.csv
           "3,20,2.0,964982226\n")
MOVIES = ('movieId,title,genres\n10,"American President, The (1995)",Comedy|Drama\n'
          "20,Heat (1995),Action|Crime\n")


def test_movielens_latest_extra_column_and_unknown_item(tmp_path: Path):
    (tmp_path / "ratings.csv").write_text(RATINGS)
    (tmp_path / "movies.csv").write_text(MOVIES)
    ds = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))
    pairs = sorted(zip(ds.interactions["user_id"], ds.interactions["item_id"]))
    assert pairs == [("1", "10"), ("2", "10"), ("3", "20")]
    assert ds.notes == {
        "ratings.csv: rows with more fields than the header's 4, skipped": {"count": 1, "lines": [3]},
        "ratings.csv: interactions with items missing from the items file, skipped": {"count": 1, "lines": [5]},
    }


def test_table_csv_non_utf8_byte_is_repaired_as_latin1_and_reported(tmp_path: Path):
    data = b"user,item,stars,ts\nu1,caf\xe9,4,100\nu1,tea,3,101\nu2,tea,5,102,extra\n"
    (tmp_path / "inter.csv").write_bytes(data)
    (tmp_path / "items.csv").write_bytes("item,name\ncafé,Café Society\ntea,Tea\n".encode())
    cfg = DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.csv", items_file="items.csv",
                        columns={"user_id": "user", "item_id": "item", "rating": "stars", "timestamp": "ts",
                                 "title": "name"})
    ds = load_dataset(cfg)
    assert sorted(ds.interactions["item_id"]) == ["café", "tea"]  # no replacement character
    assert "\ufffd" not in "".join(ds.items["item_id"])
    assert ds.notes == {
        "inter.csv: lines not UTF-8, repaired as Latin-1": {"count": 1, "lines": [2]},
        "inter.csv: rows with more fields than the header's 4, skipped": {"count": 1, "lines": [4]},
    }


def test_table_interactions_without_item_are_skipped(tmp_path: Path):
    (tmp_path / "inter.csv").write_text("user_id,item_id,rating,timestamp\nu1,a,4,1\nu1,ghost,4,2\nu2,a,3,3\n")
    (tmp_path / "items.csv").write_text("item_id,title\na,Alpha\n")
    ds = load_dataset(DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.csv",
                                    items_file="items.csv"))
    assert ds.interactions.height == 2
    assert ds.notes == {"inter.csv: interactions with items missing from the items file, skipped":
                        {"count": 1, "lines": [3]}}
