"""Format "table" reads data where teams keep it (pipelines/data/table_files.py): one file, a folder of Parquet
files, globs, Hive partitions, and object-store URIs (fsspec ``memory://``; ``s3://`` on moto's local S3),
each loading the same tables as the single file; messages keep the URI as written."""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import polars as pl
import pytest
from typer.testing import CliRunner

import pipelines.data.table as table_module
from jobs.cli import app
from jobs.config import load_config
from pipelines.data import DatasetConfig, load_dataset
from pipelines.data.readers import DataFileError
from tests.helpers import local_s3, use_s3

EVENTS = pl.DataFrame(
    {
        "user_id": [1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 6],
        "item_id": ["a", "b", "c", "a", "d", "b", "c", "e", "a", "e", "d", "c"],
        "rating": [5, 3, 4, 2, 5, 4, 5, 1, 3, 4, 5, 2],
        "ts": [100 + i for i in range(12)],
        "session": [f"s{i}" for i in range(12)],  # not mapped: never read
    }
)
ITEMS = pl.DataFrame(
    {
        "item_id": ["a", "b", "c", "d", "e"],
        "title": ["Kettle", "Mug", "Teapot", "Spoon", "Tray"],
        "genres": ["kitchen|tea", "kitchen", "kitchen|tea", "cutlery", "kitchen"],
        "brand": ["Acme", "Brew", "Acme", "Dine", "Brew"],
        "price": [20.0, 5.5, 31.0, 2.25, 12.0],
    }
)
USERS = pl.DataFrame({"user_id": [1, 2, 3, 4, 5, 6], "age": [31, 45, 22, 38, 50, 27]})
COLUMNS = {"timestamp": "ts"}


def _write_tables(root: str, fs: fsspec.AbstractFileSystem) -> None:
    """Interactions several ways under ``root`` on ``fs`` (plus items and users beside them)."""
    fs.makedirs(root, exist_ok=True)

    def put(frame: pl.DataFrame, name: str) -> None:
        fs.makedirs(f"{root}/{name}".rsplit("/", 1)[0], exist_ok=True)
        with fs.open(f"{root}/{name}", "wb") as fh:
            frame.write_parquet(fh)

    put(EVENTS, "events.parquet")
    with fs.open(f"{root}/events.csv", "wb") as fh:
        EVENTS.write_csv(fh)
    put(EVENTS.slice(0, 5), "events/part-0.parquet")  # a Parquet folder, as Spark writes one
    put(EVENTS.slice(5), "events/part-1.parquet")
    fs.pipe(f"{root}/events/_SUCCESS", b"")
    put(EVENTS.slice(0, 7), "nested/2024/a.parquet")
    put(EVENTS.slice(7), "nested/2025/06/b.parquet")
    for stars in EVENTS["rating"].unique():  # Hive: the rating lives in the folder names only
        put(EVENTS.filter(pl.col("rating") == stars).drop("rating"), f"hive/rating={stars}/part.parquet")
    put(ITEMS, "items.parquet")
    put(USERS, "users.parquet")


@pytest.fixture
def local_shop(tmp_path) -> Path:
    _write_tables(str(tmp_path / "shop"), fsspec.filesystem("file"))
    return tmp_path / "shop"


@pytest.fixture
def memory_shop():
    fs = fsspec.filesystem("memory")
    root = f"/shop-{uuid.uuid4().hex[:8]}"
    _write_tables(root, fs)
    yield f"memory://{root.lstrip('/')}"
    fs.rm(root, recursive=True)


def _load(path: str, **cfg) -> object:
    cfg.setdefault("columns", COLUMNS)
    return load_dataset(DatasetConfig(format="table", path=path, **cfg))


def _same_tables(ds, expected) -> None:
    assert ds.interactions.equals(expected.interactions)
    assert ds.items.equals(expected.items)
    assert ds.users.equals(expected.users)


def test_folder_globs_hive_and_memory_uri_load_what_the_file_does(local_shop, memory_shop):
    tables = {"items_file": "items.parquet", "users_file": "users.parquet"}
    single = _load(str(local_shop), interactions_file="events.parquet", **tables)
    assert single.interactions.height == 12
    assert single.items.columns[-2:] == ["brand", "price"]  # attribute columns kept for the prompts
    assert single.items.filter(pl.col("item_id") == "c").select("brand", "price").row(0) == ("Acme", 31.0)
    assert single.users.rows()[0] == ("1", 31)
    for inside in ("events", "events/", "events/*.parquet", "nested/**/*.parquet", "hive", "events.csv"):
        _same_tables(_load(str(local_shop), interactions_file=inside, **tables), single)
    for uri in (f"{memory_shop}/events/", f"{memory_shop}/nested/**/*.parquet", f"{memory_shop}/hive"):
        # items_file and users_file resolve beside the interactions folder: memory://shop/items.parquet
        _same_tables(_load(uri, **tables), single)
    _same_tables(_load(memory_shop, interactions_file="events.csv", **tables), single)
    named = _load(str(local_shop), interactions_file="events", items_file=f"{memory_shop}/items.parquet")
    assert named.items.equals(single.items)  # a URI is taken as it is, wherever path points
    assert _load(f"{local_shop}/events").name == "events"


def test_only_mapped_interaction_columns_are_read(local_shop, monkeypatch):
    asked: list[object] = []
    read = table_module.read_parquet

    def spy(src, columns, row_no):
        asked.append(None if columns is None else sorted(columns))
        return read(src, columns, row_no)

    monkeypatch.setattr(table_module, "read_parquet", spy)
    _load(str(local_shop / "events"), items_file="items.parquet")
    assert asked == [["item_id", "rating", "ts", "user_id"], None]  # interactions: 4 of 5 columns; items: all


def test_a_uri_that_matches_nothing_is_named_as_written(memory_shop):
    with pytest.raises(FileNotFoundError, match=r"dataset.path 'memory://nowhere/events/' does not exist"):
        _load("memory://nowhere/events/")
    with pytest.raises(FileNotFoundError, match=r"'memory://nowhere/events/\*\.parquet' matches no file"):
        _load("memory://nowhere/events/*.parquet")
    shop = memory_shop.removeprefix("memory://")  # fsspec writes memory paths as memory:///shop
    with pytest.raises(FileNotFoundError, match=rf"dataset.items_file 'memory:///{shop}/goods.parquet' does not exist"):
        _load(f"{memory_shop}/events", items_file="goods.parquet")


def test_missing_column_names_the_dataset_and_lists_its_columns(local_shop):
    with pytest.raises(DataFileError) as err:
        _load(str(local_shop / "events"), columns={"timestamp": "ts", "rating": "stars"})
    assert str(err.value) == (
        f"{local_shop / 'events'}: missing rating (column 'stars'); found columns "
        "['user_id', 'item_id', 'rating', 'ts', 'session']; if this folder holds the tables, set "
        "dataset.interactions_file"
    )
    with pytest.raises(DataFileError, match=r"hive: missing timestamp \(column 'when'\); found columns \[.*'rating'\]"):
        _load(str(local_shop), interactions_file="hive", columns={"timestamp": "when"})
    (local_shop / "texts").mkdir()
    ITEMS.write_csv(local_shop / "texts" / "items.csv")
    with pytest.raises(DataFileError, match=r"dataset.items_file '.*texts' is a folder without Parquet files"):
        _load(str(local_shop), interactions_file="events", items_file="texts")


def test_bad_rows_keep_their_rules_across_files(tmp_path):
    root = tmp_path / "events"
    root.mkdir()
    EVENTS.slice(0, 6).write_parquet(root / "a.parquet")
    EVENTS.slice(6).with_columns(rating=pl.when(pl.col("ts") == 108).then(None).otherwise("rating")).write_parquet(
        root / "b.parquet"
    )
    ds = _load(str(root))
    assert ds.interactions.height == 11
    assert ds.notes["events: malformed rows (empty or invalid 'rating'), skipped"] == {"count": 1, "lines": [9]}


def test_table_yaml_validates_loads_and_plans(local_shop, tmp_path):
    cfg = load_config(Path("jobs/configs/table.yaml"), [f"dataset.path={local_shop}"])
    ds = load_dataset(cfg.dataset)
    assert ds.name == "shop" and ds.interactions.height == 12 and ds.users.height == 6
    assert {"brand", "price"} <= set(ds.items.columns)
    args = ["run", "jobs/configs/table.yaml", "--dry-run", "--set", f"dataset.path={local_shop}"]
    result = CliRunner().invoke(app, [*args, "--set", f"output.path={tmp_path / 'out'}"])
    assert result.exit_code == 0, result.output
    assert "to generate: 11 entities" in " ".join(result.output.split())  # 6 users, 5 items, as written


def test_parquet_folder_on_a_local_s3(local_shop, monkeypatch):
    pytest.importorskip("s3fs")
    with local_s3() as endpoint:
        use_s3(endpoint, monkeypatch)
        fs = fsspec.filesystem("s3")
        fs.mkdir("shop")
        fs.put(f"{local_shop}/hive", "shop/events", recursive=True)
        fs.put(f"{local_shop}/items.parquet", "shop/items.parquet")
        single = _load(str(local_shop), interactions_file="events.parquet", items_file="items.parquet")
        _same_tables(_load("s3://shop/events/", items_file="items.parquet"), single)
