"""Loaders on small files written here: every format, encodings, gzip, malformed lines, missing files."""

from __future__ import annotations

import gzip
import json
import logging

import polars as pl
import pytest

from pipelines.data import DatasetConfig, load_dataset
from pipelines.data.movielens import detect_variant
from pipelines.data.readers import DataFileError
from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS
from pipelines.knowledge.prompts import item_prompt


def _write(path, text: str, encoding: str = "utf-8") -> None:
    path.write_bytes(text.encode(encoding))


def _check_schema(ds) -> None:
    assert dict(ds.interactions.schema) == INTERACTIONS_SCHEMA
    assert list(ds.items.columns[: len(ITEM_COLUMNS)]) == list(ITEM_COLUMNS)
    assert {n: ds.items.schema[n] for n in ITEM_COLUMNS} == ITEM_COLUMNS
    assert ds.users.columns[0] == "user_id" and ds.users.schema["user_id"] == pl.Utf8


def _flags(*on: int) -> str:
    return "|".join("1" if k in on else "0" for k in range(19))


@pytest.fixture
def ml100k(tmp_path):
    _write(
        tmp_path / "u.data",
        "1\t10\t4\t881250949\n1\t20\t3\t881250950\nthis line is broken\n2\t10\t5\t881250960\n2\tx\t5\tnot-a-time\n",
    )
    # Latin-1 byte for "é", trailing article, a year only in the release date, the "unknown" genre
    _write(
        tmp_path / "u.item",
        f"10|Café Society, The (1995)|01-Jan-1995||http://x|{_flags(1, 5)}\n"
        f"20|Heat|01-Jan-1996||http://y|{_flags(0)}\n",
        "latin-1",
    )
    _write(tmp_path / "u.user", "1|24|M|technician|85711\n2|53|F|other|94043\n")
    return tmp_path


def test_movielens_100k(ml100k, caplog):
    with caplog.at_level(logging.WARNING):
        ds = load_dataset(DatasetConfig(format="movielens", path=str(ml100k)))
    _check_schema(ds)
    assert ds.name == "ml-100k" and ds.domain == "movie"
    assert ds.interactions.to_dicts() == [
        {"user_id": "1", "item_id": "10", "rating": 4.0, "timestamp": 881250949},
        {"user_id": "1", "item_id": "20", "rating": 3.0, "timestamp": 881250950},
        {"user_id": "2", "item_id": "10", "rating": 5.0, "timestamp": 881250960},
    ]
    # two bad lines (3: too few fields, 5: unparseable timestamp) reported with their numbers
    assert "skipped 2 malformed line(s) of 5 (first at line 3, 5)" in caplog.text
    first = ds.items.row(0, named=True)
    assert first["title"] == "The Café Society" and first["year"] == 1995
    assert first["genres"] == ["Action", "Comedy"]
    assert (first["category"], first["sub_category"]) == ("Action", "Comedy")
    second = ds.items.row(1, named=True)
    assert second["year"] == 1996 and second["genres"] == ["unknown"]
    assert ds.users.select("user_id", "age", "gender", "occupation").rows() == [
        ("1", 24, "M", "technician"),
        ("2", 53, "F", "other"),
    ]


def test_movielens_1m_and_10m(tmp_path):
    for d, with_users in ((tmp_path / "one", True), (tmp_path / "ten", False)):
        d.mkdir()
        _write(d / "ratings.dat", "1::10::5::978300760\n1::20::3.5::978302109\n2::20::4::978300000\n")
        _write(
            d / "movies.dat",
            "10::Toy Story (1995)::Animation|Children's|Comedy\n20::Señor Jumanji (1995)::(no genres listed)\n",
            "latin-1",
        )
        if with_users:
            _write(d / "users.dat", "1::F::1::10::48067\n2::M::56::16::70072\n")
    assert detect_variant(tmp_path / "one") == "1m" and detect_variant(tmp_path / "ten") == "10m"
    one = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path / "one")))
    _check_schema(one)
    assert one.users.select("user_id", "gender", "age", "occupation").rows() == [
        ("1", "F", 1, "K-12 student"),
        ("2", "M", 56, "self-employed"),
    ]
    ten = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path / "ten")))
    assert ten.name == "ml-10m" and ten.users["user_id"].to_list() == ["1", "2"]
    assert ten.interactions["rating"].to_list() == [5.0, 3.5, 4.0]
    items = {r["item_id"]: r for r in ten.items.iter_rows(named=True)}
    assert items["10"]["genres"] == ["Animation", "Children's", "Comedy"]
    assert items["20"]["title"] == "Señor Jumanji" and items["20"]["genres"] == []
    assert items["20"]["category"] is None


def test_movielens_latest_csv(tmp_path):
    _write(
        tmp_path / "ratings.csv",
        "userId,movieId,rating,timestamp\n1,10,4.0,964982703\n1,20,4.5,964981247\n"
        "2,20,,964981000\n3,10,2.0,964981111\n",
    )
    _write(
        tmp_path / "movies.csv",
        'movieId,title,genres\n10,"American President, The (1995)",Comedy|Drama\n20,Heat (1995),Action\n',
    )
    ds = load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))
    assert ds.name == "ml-latest"
    assert ds.interactions.select("user_id", "item_id").rows() == [("1", "20"), ("1", "10"), ("3", "10")]
    assert ds.items.select("title", "year", "category").rows() == [
        ("The American President", 1995, "Comedy"),
        ("Heat", 1995, "Action"),
    ]


def test_movielens_missing_and_unreadable(tmp_path):
    with pytest.raises(FileNotFoundError, match="no MovieLens ratings file"):
        load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(DatasetConfig(format="movielens", path=str(tmp_path / "nowhere")))
    _write(tmp_path / "u.data", "1\t10\t4\t881250949\n")
    with pytest.raises(FileNotFoundError, match="u.item"):  # the missing companion file is named
        load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))
    _write(tmp_path / "u.data", "garbage\n" * 9 + "1\t10\t4\t881250949\n")
    with pytest.raises(DataFileError, match=r"u\.data: 9 of 10 lines are malformed"):
        load_dataset(DatasetConfig(format="movielens", path=str(tmp_path)))


REVIEWS_OLD = [
    {"reviewerID": "A1", "asin": "B1", "overall": 5.0, "unixReviewTime": 1400000000},
    {"reviewerID": "A1", "asin": "B2", "overall": 3.0, "unixReviewTime": 1400000100},
    {"reviewerID": "A2", "asin": "B1", "overall": 4.0, "unixReviewTime": 1300000000},
    {"reviewerID": "A2", "asin": "B9", "overall": 4.0, "unixReviewTime": 1300000001},  # no metadata
]
META_OLD = [
    {"asin": "B1", "title": "The Night Garden", "categories": [["Books", "Literature & Fiction", "Mystery"]]},
    {"asin": "B2", "title": "Cooking for Two", "categories": [["Books", "Cookbooks"]], "date": "June 1, 2004"},
    {"asin": "B3", "title": "Unrated Book", "categories": [["Books"]]},
]


def _jsonl(path, records, extra_lines=(), compress=False) -> None:
    text = "\n".join([json.dumps(r) for r in records] + list(extra_lines)) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())


@pytest.mark.parametrize("compress", [False, True])
def test_amazon_old_naming(tmp_path, compress, caplog):
    suffix = ".json.gz" if compress else ".json"
    _jsonl(tmp_path / f"reviews_Books{suffix}", REVIEWS_OLD, extra_lines=["{not json"], compress=compress)
    # 2014 metadata files are Python literals, not JSON
    meta_text = "\n".join(repr(r) for r in META_OLD) + "\n"
    meta_path = tmp_path / f"meta_Books{suffix}"
    meta_path.write_bytes(gzip.compress(meta_text.encode()) if compress else meta_text.encode())
    with caplog.at_level(logging.WARNING):
        ds = load_dataset(DatasetConfig(format="amazon", path=str(tmp_path)))
    _check_schema(ds)
    assert ds.domain == "book" and ds.name == "amazon-reviews_Books"
    assert "skipped 1 malformed line(s) of 5 (first at line 5)" in caplog.text
    assert "dropped 1 reviews of 1 items without metadata" in caplog.text
    assert ds.interactions.select("user_id", "item_id", "timestamp").rows() == [
        ("A1", "B1", 1400000000),
        ("A1", "B2", 1400000100),
        ("A2", "B1", 1300000000),
    ]
    items = {r["item_id"]: r for r in ds.items.iter_rows(named=True)}
    assert (items["B1"]["category"], items["B1"]["sub_category"]) == ("Literature & Fiction", "Mystery")
    assert items["B1"]["genres"] == ["Literature & Fiction", "Mystery"]
    assert items["B2"]["category"] == "Cookbooks" and items["B2"]["sub_category"] is None
    assert items["B2"]["year"] == 2004
    assert items["B3"]["category"] == "Books"  # one-level path: the root is the category
    assert ds.users["user_id"].to_list() == ["A1", "A2"]


def test_amazon_2023_naming_single_file(tmp_path):
    reviews = [
        {"user_id": "U1", "asin": "X1", "parent_asin": "P1", "rating": 4, "timestamp": 1600000000123},
        {"user_id": "U1", "parent_asin": "P2", "rating": "5.0", "timestamp": 1600000100000},
        {"user_id": "U2", "parent_asin": "P1", "rating": None, "timestamp": 1600000100000},
    ]
    meta = [
        {"parent_asin": "P1", "title": " Deep Space ", "categories": ["Books", "Science Fiction", "Space Opera"]},
        {"parent_asin": "P2", "title": "Gardens", "categories": []},
    ]
    _jsonl(tmp_path / "Books.jsonl", reviews)
    _jsonl(tmp_path / "meta_Books.jsonl", meta)
    ds = load_dataset(
        DatasetConfig(format="amazon", path=str(tmp_path / "Books.jsonl"), metadata_file="meta_Books.jsonl")
    )
    assert ds.interactions.rows() == [("U1", "P1", 4.0, 1600000000), ("U1", "P2", 5.0, 1600000100)]
    items = {r["item_id"]: r for r in ds.items.iter_rows(named=True)}
    assert items["P1"]["title"] == "Deep Space" and items["P1"]["sub_category"] == "Space Opera"
    assert items["P2"]["category"] is None


def test_amazon_keeps_brand_price_description(tmp_path):
    """brand, price and description reach the items table (2018 and 2023 namings) and the e-commerce prompt."""
    reviews = [
        {"reviewerID": "A1", "asin": "G1", "overall": 5.0, "unixReviewTime": 1500000000},
        {"reviewerID": "A1", "asin": "G2", "overall": 4.0, "unixReviewTime": 1500000100},
        {"user_id": "U2", "parent_asin": "P3", "rating": 3.0, "timestamp": 1600000000000},
        {"user_id": "U2", "parent_asin": "P4", "rating": 4.0, "timestamp": 1600000000001},
    ]
    meta = [  # 2018: brand, price as text, description as paragraphs with HTML
        {
            "asin": "G1",
            "title": "Cafe Card",
            "category": ["Gift Cards", "Gift Cards"],
            "brand": " Cafe Nine ",
            "price": "$1,025.50",
            "description": ["<b>Valid</b> in store.", "", "Never expires."],
        },
        {
            "asin": "G2",
            "title": "Range Card",
            "category": ["Gift Cards"],
            "brand": "",
            "price": "$5.00 - $9.00",
            "description": [],
        },
        # 2023: store is the brand, price a number or null, description a list
        {
            "parent_asin": "P3",
            "title": "Mug",
            "categories": ["Home", "Kitchen"],
            "store": "Acme",
            "price": 12,
            "description": ["Holds tea."],
        },
        {
            "parent_asin": "P4",
            "title": "Lid",
            "categories": ["Home"],
            "store": None,
            "price": None,
            "description": "plain text",
        },
    ]
    _jsonl(tmp_path / "reviews.json", reviews)
    _jsonl(tmp_path / "meta.json", meta)
    ds = load_dataset(DatasetConfig(format="amazon", path=str(tmp_path)))
    _check_schema(ds)
    assert ds.items.schema["price"] == pl.Float64 and ds.items.schema["brand"] == pl.Utf8
    items = {r["item_id"]: r for r in ds.items.iter_rows(named=True)}
    got = {k: (items[k]["brand"], items[k]["price"], items[k]["description"]) for k in items}
    assert got == {
        "G1": ("Cafe Nine", 1025.5, "Valid in store. Never expires."),
        "G2": (None, None, None),  # empty brand, a price range and no paragraphs are unknown
        "P3": ("Acme", 12.0, "Holds tea."),
        "P4": (None, None, "plain text"),
    }
    prompt = item_prompt(items["G1"], "ecommerce", max_words=30)
    assert "Title: Cafe Card\nBrand: Cafe Nine\nPrice: 1025.5\nCategory: Gift Cards\n" in prompt
    assert "Description: Valid in store. Never expires.\n" in prompt


def test_amazon_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Amazon reviews file"):
        load_dataset(DatasetConfig(format="amazon", path=str(tmp_path)))
    (tmp_path / "r.json").write_text("nope\n" * 5)
    with pytest.raises(DataFileError, match=r"r\.json: 5 of 5 lines are malformed"):
        load_dataset(DatasetConfig(format="amazon", path=str(tmp_path)))
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataFileError, match="bad.json.gz: not a readable gzip file"):
        load_dataset(DatasetConfig(format="amazon", path=str(tmp_path / "bad.json.gz")))


def test_table_parquet_and_csv(tmp_path):
    pl.DataFrame(
        {
            "uid": [7, 7, 8],
            "iid": ["a", "b", "a"],
            "stars": [5, 2, 4],
            "when": ["2020-01-01T00:00:00", "1577836900", "2020-01-02"],
        }
    ).write_csv(tmp_path / "events.csv")
    pl.DataFrame(
        {"iid": ["a", "b"], "name": ["Alpha", None], "tags": ["x| y", ""], "year": [1999, None], "price": [1.5, 2.0]}
    ).write_parquet(tmp_path / "items.parquet")
    pl.DataFrame({"uid": [7, 8], "age": [30, 40]}).write_parquet(tmp_path / "users.parquet")
    cfg = DatasetConfig(
        format="table",
        path=str(tmp_path),
        interactions_file="events.csv",
        items_file="items.parquet",
        users_file="users.parquet",
        domain="book",
        timestamp_format="iso",
        columns={
            "user_id": "uid",
            "item_id": "iid",
            "rating": "stars",
            "timestamp": "when",
            "title": "name",
            "genres": "tags",
        },
    )
    ds = load_dataset(cfg)
    _check_schema(ds)
    assert ds.domain == "book" and ds.name == "events"
    assert ds.interactions.rows() == [
        ("7", "a", 5.0, 1577836800),
        ("7", "b", 2.0, 1577836900),
        ("8", "a", 4.0, 1577923200),
    ]
    assert ds.items.select("item_id", "title", "genres", "category", "year", "price").rows() == [
        ("a", "Alpha", ["x", "y"], "x", 1999, 1.5),
        ("b", "b", [], None, None, 2.0),
    ]
    assert ds.users.rows() == [("7", 30), ("8", 40)]


def test_table_errors_name_the_column_and_rows(tmp_path, caplog):
    pl.DataFrame({"user_id": ["1"], "item_id": ["2"], "timestamp": [1]}).write_parquet(tmp_path / "i.parquet")
    with pytest.raises(DataFileError, match=r"i\.parquet: missing rating \(column 'rating'\)"):
        load_dataset(DatasetConfig(format="table", path=str(tmp_path / "i.parquet")))
    pl.DataFrame(
        {
            "user_id": ["1", "1", None, "2", "2"],
            "item_id": ["2", "3", "4", "2", "5"],
            "rating": ["4", "five", "3", "1", "2"],
            "timestamp": [1, 2, 3, 4, 5],
        },
    ).write_parquet(tmp_path / "j.parquet")
    with caplog.at_level(logging.WARNING):
        ds = load_dataset(DatasetConfig(format="table", path=str(tmp_path / "j.parquet")))
    assert ds.interactions.select("user_id", "item_id").rows() == [("1", "2"), ("2", "2"), ("2", "5")]
    assert ds.items["title"].to_list() == ["2", "5"]  # no items file: the id is the title
    assert "skipped 2 malformed row(s) of 5 (first at row 2, 3)" in caplog.text
    with pytest.raises(ValueError, match="set dataset.interactions_file"):
        load_dataset(DatasetConfig(format="table", path=str(tmp_path)))


def test_config_rejects_unknown_key_and_missing_path():
    with pytest.raises(ValueError, match="limit_user"):
        DatasetConfig.model_validate({"format": "synthetic", "limit_user": 5})
    with pytest.raises(ValueError, match="dataset.path is required"):
        DatasetConfig(format="movielens")
