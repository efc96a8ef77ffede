"""Input that used to be accepted silently is skipped or repaired by rule and counted in the load report
(``Dataset.notes``) with file line numbers (the header is line 1)."""

from __future__ import annotations

from pathlib import Path

from pipelines.data import DatasetConfig, load_dataset

RATINGS = (
    "userId,movieId,rating,timestamp\n"
    "1,10,4.0,964982703\n"
    "1,20,4.5,964981247,surprise\n"  # line 3: an extra column
    "2,10,3.0,964982224\n"
    "2,99,5.0,964982225\n"  # line 5: item 99 is not in movies.csv
    "3,20,2.0,964982226\n"
)
MOVIES = 'movieId,title,genres\n10,"American President, The (1995)",Comedy|Drama\n20,Heat (1995),Action|Crime\n'


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
    cfg = DatasetConfig(
        format="table",
        path=str(tmp_path),
        interactions_file="inter.csv",
        items_file="items.csv",
        columns={"user_id": "user", "item_id": "item", "rating": "stars", "timestamp": "ts", "title": "name"},
    )
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
    ds = load_dataset(
        DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.csv", items_file="items.csv")
    )
    assert ds.interactions.height == 2
    assert ds.notes == {
        "inter.csv: interactions with items missing from the items file, skipped": {"count": 1, "lines": [3]}
    }


# ---- issue 23, item 6: ratings validated, timestamps by a declared format, duplicates by a rule ----

import polars as pl  # noqa: E402
import pytest  # noqa: E402

from pipelines.data.readers import DataFileError  # noqa: E402


def _table(tmp_path: Path, body: str, **cfg) -> DatasetConfig:
    (tmp_path / "inter.csv").write_text("user_id,item_id,rating,timestamp\n" + body)
    return DatasetConfig(format="table", path=str(tmp_path), interactions_file="inter.csv", **cfg)


def test_nan_negative_and_out_of_scale_ratings_are_skipped_and_counted(tmp_path: Path):
    cfg = _table(tmp_path, "u1,a,4,1\nu1,b,nan,2\nu2,a,-3,3\nu2,b,9,4\nu3,a,5,5\n", rating_scale=(1, 5))
    ds = load_dataset(cfg)
    assert sorted(ds.interactions["rating"].to_list()) == [4.0, 5.0]
    note = ds.notes[
        "interactions with invalid ratings (NaN, infinite or negative, or outside dataset.rating_scale "
        "[1.0, 5.0]), skipped"
    ]
    assert note["count"] == 3 and note["first"][0].startswith("user u1 item b rating nan")
    ds = load_dataset(_table(tmp_path, "u1,a,4,1\nu1,b,nan,2\nu2,a,-3,3\nu2,b,9,4\n"))  # no scale: 9 is kept
    assert sorted(ds.interactions["rating"].to_list()) == [4.0, 9.0]


@pytest.mark.parametrize("first", ["2020-01-05", "02/03/2020"])
def test_timestamps_follow_the_declared_format_whatever_the_row_order(first, tmp_path: Path):
    rows = {"2020-01-05": "u1,a,4,2020-01-05\n", "02/03/2020": "u2,b,4,02/03/2020\n"}
    other = next(k for k in rows if k != first)
    ds = load_dataset(_table(tmp_path, rows[first] + rows[other] + "u3,a,3,1583107200\n", timestamp_format="%d/%m/%Y"))
    times = dict(zip(ds.interactions["user_id"], ds.interactions["timestamp"]))
    assert times == {"u2": 1583107200, "u3": 1583107200}  # 2 March 2020 (dd/mm), digits are epoch seconds
    assert ds.notes == {
        "inter.csv: timestamps in column 'timestamp' not matching dataset.timestamp_format '%d/%m/%Y', skipped": {
            "count": 1,
            "lines": [2 if first == "2020-01-05" else 3],
        }
    }
    ds = load_dataset(_table(tmp_path, rows[first] + rows[other] + "u3,a,3,1583107200\n", timestamp_format="iso"))
    assert dict(zip(ds.interactions["user_id"], ds.interactions["timestamp"])) == {"u1": 1578182400, "u3": 1583107200}


def test_timestamps_not_in_the_format_name_the_column(tmp_path: Path):
    (tmp_path / "inter.csv").write_text("uid,iid,stars,when\nu1,a,4,2020-01-05\nu2,b,3,2020-01-06\n")
    cfg = DatasetConfig(
        format="table",
        path=str(tmp_path),
        interactions_file="inter.csv",
        columns={"user_id": "uid", "item_id": "iid", "rating": "stars", "timestamp": "when"},
    )
    with pytest.raises(
        DataFileError,
        match=r"inter.csv: column 'when': 2 of 2 timestamps do not match "
        r"dataset.timestamp_format 'epoch' \(first at row 2: '2020-01-05'\)",
    ):
        load_dataset(cfg)


def test_conflicting_duplicates_keep_the_newest_row_and_are_counted(tmp_path: Path):
    ds = load_dataset(_table(tmp_path, "u1,a,4,100\nu1,a,1,200\nu1,b,2,50\nu1,b,5,50\nu2,a,3,10\n"))
    rows = {(u, i): (r, t) for u, i, r, t in ds.interactions.iter_rows()}
    assert rows == {("u1", "a"): (1.0, 200), ("u1", "b"): (5.0, 50), ("u2", "a"): (3.0, 10)}
    note = ds.notes[
        "duplicate (user, item) interactions: the newest kept (equal timestamps: the later row), older rows skipped"
    ]
    assert note["count"] == 2 and pl.Series(note["first"]).str.contains("rating 4.0").any()
