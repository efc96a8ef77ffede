"""`laser init DATA` guesses a table job's config from the tables' schemas and a sample: the written config
loads, its dataset loads, and a dry run plans entities, as written (MovieLens-like Parquet folder, an implicit
shop table with events, Hive partitions holding the time, a memory:// URI); no id column is one clear error;
an existing config is kept unless --force."""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

import pipelines.data.guess as guess_module
from jobs.cli import app
from jobs.config import load_config
from pipelines.data import load_dataset

RATINGS = pl.DataFrame(
    {
        "userId": [u for u in range(1, 9) for _ in range(6)],
        "movieId": [(u * 5 + k) % 10 + 1 for u in range(1, 9) for k in range(6)],
        "rating": [1 + (u + k) % 5 for u in range(1, 9) for k in range(6)],
        "timestamp": [978_300_000 + 60 * i for i in range(48)],
    }
)
MOVIES = pl.DataFrame(
    {
        "movieId": list(range(1, 11)),
        "title": [f"Film {n} ({1990 + n})" for n in range(1, 11)],
        "genres": ["Comedy|Drama", "Action", "Drama|Romance", "Comedy", "Horror|Thriller"] * 2,
    }
)
USERS = pl.DataFrame({"userId": list(range(1, 9)), "gender": list("FMFMFMFM"), "age": [18, 25, 35, 45] * 2})


def _init(*args: str) -> object:
    return CliRunner().invoke(app, ["init", *args])


def _ml_folder(root: Path) -> Path:
    (root / "ratings").mkdir(parents=True)
    RATINGS.slice(0, 24).write_parquet(root / "ratings" / "part-0.parquet")
    RATINGS.slice(24).write_parquet(root / "ratings" / "part-1.parquet")
    MOVIES.write_parquet(root / "movies.parquet")
    USERS.write_parquet(root / "users.parquet")
    return root


def _dry_run(config: Path, out: Path) -> str:
    result = CliRunner().invoke(app, ["run", str(config), "--dry-run", "--set", f"output.path={out}"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_movielens_like_folder_gives_a_config_that_plans(tmp_path):
    root = _ml_folder(tmp_path / "ml")
    config = tmp_path / "ml.yaml"
    result = _init(str(root / "ratings"), "--items", str(root / "movies.parquet"), "--users",
                   str(root / "users.parquet"), "-o", str(config))  # fmt: skip
    assert result.exit_code == 0, result.output
    text = config.read_text()
    assert "user_id: userId" in text and "column 'userId' (int64, 8 distinct in 48 sampled rows)" in text
    cfg = load_config(config)
    data = cfg.dataset
    assert (data.columns.user_id, data.columns.item_id, data.columns.rating) == ("userId", "movieId", "rating")
    assert data.feedback == "explicit" and data.rating_scale == (1.0, 5.0) and data.timestamp_format == "epoch"
    assert cfg.prompts.template == "movie" and "films: genres, and titles with years" in text
    ds = load_dataset(data)
    assert ds.interactions.height == 48 and set(ds.users.columns) >= {"gender", "age"}
    assert ds.items.filter(pl.col("item_id") == "1")["genres"].to_list() == [["Comedy", "Drama"]]
    assert "to generate: 18 entities" in _dry_run(config, tmp_path / "out")  # 8 users, 10 items


def test_implicit_shop_csv_with_events_and_text_times(tmp_path):
    events = ("view", "click", "add_to_cart", "purchase")
    rows = [
        (f"c{u}", f"sku{(u + k) % 7}", events[(u * k) % 4], 1 + k % 3, f"2024-03-{1 + k:02d} 10:{u:02d}:00")
        for u in range(10)
        for k in range(5)
    ]
    pl.DataFrame(rows, schema=["customer_id", "sku", "action", "qty", "event_time"], orient="row").write_csv(
        tmp_path / "events.csv"
    )
    pl.DataFrame(
        {
            "sku": [f"sku{n}" for n in range(7)],
            "product_name": [f"Mug {n}" for n in range(7)],
            "brand": ["Acme", "Brew"] * 3 + ["Acme"],
            "price": [5.0 + n for n in range(7)],
            "category": ["Kitchen", "Home"] * 3 + ["Home"],
        }  # fmt: skip
    ).write_parquet(tmp_path / "products.parquet")
    config = tmp_path / "shop.yaml"
    result = _init(str(tmp_path / "events.csv"), "--items", str(tmp_path / "products.parquet"), "-o", str(config))
    assert result.exit_code == 0, result.output
    cfg = load_config(config)
    data = cfg.dataset
    assert data.feedback == "implicit" and data.rating_scale is None and data.timestamp_format == "iso"
    assert (data.columns.event, data.columns.weight, data.columns.title) == ("action", "qty", "product_name")
    assert data.event_weights == {"add_to_cart": 2.0, "click": 1.0, "purchase": 3.0, "view": 0.5}
    assert cfg.prompts.template == "ecommerce" and "['brand', 'price']" in config.read_text()
    ds = load_dataset(data)
    assert ds.interactions.height == 50 and ds.interactions["rating"].null_count() == 50
    assert ds.interactions["timestamp"].min() == 1709287200  # 2024-03-01 10:00:00 UTC


def test_hive_partitions_hold_the_time(tmp_path):
    for day in (1, 2, 3):
        part = tmp_path / "clicks" / f"day=2024-05-0{day}"
        part.mkdir(parents=True)
        pl.DataFrame(
            {"user": [f"u{u}" for u in range(6)], "item_id": [f"a{(u + day) % 4}" for u in range(6)]}
        ).write_parquet(part / "part-0.parquet")
    config = tmp_path / "clicks.yaml"
    result = _init(str(tmp_path / "clicks"), "-o", str(config))
    assert result.exit_code == 0, result.output
    data = load_config(config).dataset
    assert (data.columns.user_id, data.columns.timestamp, data.timestamp_format) == ("user", "day", "iso")
    assert data.feedback == "implicit" and data.items_file is None
    ds = load_dataset(data)
    assert ds.interactions.height == 18 and ds.interactions["timestamp"].n_unique() == 3


def test_memory_uri_plans_and_only_a_sample_is_read(tmp_path, monkeypatch):
    fs = fsspec.filesystem("memory")
    root = f"/ml-{uuid.uuid4().hex[:8]}"
    for name, frame in (("ratings/a.parquet", RATINGS.slice(0, 30)), ("ratings/b.parquet", RATINGS.slice(30)),
                        ("movies.parquet", MOVIES)):  # fmt: skip
        with fs.open(f"{root}/{name}", "wb") as fh:
            frame.write_parquet(fh)
    monkeypatch.setattr(guess_module, "SAMPLE_ROWS", 20)
    config = tmp_path / "mem.yaml"
    try:
        result = _init(f"memory:/{root}/ratings/", "--items", f"memory:/{root}/movies.parquet", "-o", str(config))
        assert result.exit_code == 0, result.output
        text = config.read_text()
        assert "4 columns, 20 rows sampled" in text and f'path: "memory:/{root}/ratings/"' in text
        assert "to generate: 18 entities" in _dry_run(config, tmp_path / "out")
    finally:
        fs.rm(root, recursive=True)


def test_no_id_column_is_one_clear_error(tmp_path):
    pl.DataFrame({"who": ["a"], "what": ["b"], "ts": [1]}).write_parquet(tmp_path / "x.parquet")
    result = _init(str(tmp_path / "x.parquet"), "-o", str(tmp_path / "x.yaml"))
    assert result.exit_code == 2
    assert "found no column for a user id and an item id among its columns ['who', 'what', 'ts']" in result.output
    assert not (tmp_path / "x.yaml").exists()


def test_existing_config_kept_unless_force(tmp_path):
    root = _ml_folder(tmp_path / "ml")
    config = tmp_path / "ml.yaml"
    config.write_text("# mine\n")
    result = _init(str(root / "ratings"), "-o", str(config))
    assert result.exit_code == 2 and "exists; pass --force to overwrite it" in result.output
    assert config.read_text() == "# mine\n"
    assert _init(str(root / "ratings"), "-o", str(config), "--force").exit_code == 0
    assert yaml.safe_load(config.read_text())["dataset"]["columns"]["item_id"] == "movieId"


@pytest.mark.parametrize("values,fmt", [(["03/21/2024"], "%m/%d/%Y"), (["01/02/2024", "05/06/2024"], "%d/%m/%Y")])
def test_text_dates_pick_a_format_and_say_when_two_fit(values, fmt):
    found = guess_module._text_time(pl.Series(values))
    assert found is not None and found[0] == fmt
    assert (len(found) == 3) == (len(values) == 2)  # both readings fit: a note names them
