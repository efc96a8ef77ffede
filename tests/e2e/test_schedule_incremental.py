"""Scheduled incremental runs end to end: tiny random Llama, local Ray, table data edited between runs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from jobs.config import load_config
from pipelines.data.config import DatasetConfig
from pipelines.ops.features.feast_repo import ingest, online_features
from pipelines.data.load import load_dataset
from pipelines.store.knowledge import read_knowledge
from pipelines.knowledge.job import run_job
from pipelines.ops.schedule.latest import read_latest
from pipelines.ops.schedule.ledger import RunLedger


def run_incremental(cfg):
    """One incremental run; its ledger row."""
    return run_job(cfg, incremental=True).record


pytestmark = pytest.mark.slow


def write_table_data(root: Path, n_users: int = 20) -> Path:
    """The synthetic demo data saved as Parquet tables (format ``table``), so a test can edit it."""
    ds = load_dataset(
        DatasetConfig(
            format="synthetic", seed=3, synthetic={"n_users": n_users, "n_items": 16, "n_clusters": 2, "max_history": 8}
        )
    )
    root.mkdir(parents=True, exist_ok=True)
    ds.interactions.write_parquet(root / "interactions.parquet")
    ds.items.write_parquet(root / "items.parquet")
    ds.users.write_parquet(root / "users.parquet")
    return root


def incremental_config(model: str, data: Path, out: Path, *extra: str):
    return load_config(
        None,
        [
            "dataset.format=table",
            f"dataset.path={data}",
            "dataset.interactions_file=interactions.parquet",
            "dataset.items_file=items.parquet",
            "dataset.users_file=users.parquet",
            "dataset.name=edit",
            "split.max_hist=4",
            f"model.name={model}",
            "model.dtype=float32",
            "decoder.name=laser",
            "decoder.params.verification=greedy",
            "generation.max_new_tokens=8",
            "generation.max_prompt_tokens=2000",
            "routing.n_clusters=2",
            "routing.max_group_size=6",
            "execution.num_workers=2",
            "execution.batch_size=4",
            f"output.path={out}",
            "output.shard_rows=8",
            *extra,
        ],
    )


def edit_users(data: Path, users: list[str]) -> None:
    """Each listed user's newest interaction changes rating in place (same timestamp: the watermark alone
    cannot see it) and, for the first user, one interaction arrives after the watermark."""
    inter = pl.read_parquet(data / "interactions.parquet")
    newest = inter.group_by("user_id").agg(pl.col("timestamp").max().alias("t_max"))
    inter = (
        inter.join(newest, on="user_id")
        .with_columns(
            rating=pl.when(pl.col("user_id").is_in(users) & (pl.col("timestamp") == pl.col("t_max")))
            .then(6.0 - pl.col("rating"))
            .otherwise(pl.col("rating"))
        )
        .drop("t_max")
    )
    seen = inter.filter(pl.col("user_id") == users[0])["item_id"]
    unseen = inter.filter(~pl.col("item_id").is_in(seen.implode()))[
        "item_id"
    ].min()  # a new interaction, not a re-rating
    first = (
        inter.filter(pl.col("user_id") == users[0])
        .tail(1)
        .with_columns(
            item_id=pl.lit(unseen, dtype=inter.schema["item_id"]),
            timestamp=pl.lit(int(inter["timestamp"].max()) + 100, dtype=inter.schema["timestamp"]),
            rating=pl.lit(1.0),
        )
    )
    pl.concat([inter, first]).write_parquet(data / "interactions.parquet")


def test_incremental_run_regenerates_exactly_the_changed_users(tiny_model, ray_session, tmp_path):
    data = write_table_data(tmp_path / "data")
    out = tmp_path / "job"
    cfg = incremental_config(tiny_model, data, out)
    first = run_incremental(cfg)
    repo, _ = ingest(out)  # the feature store after the first run
    assert first.status == "succeeded" and first.entities_changed == first.entities_unchanged == 0
    assert first.generated == first.entities_new > 0 and first.previous_watermark is None
    before = read_knowledge(out / "knowledge")
    assert before["source_hash"].null_count() == 0
    users = sorted(before.filter(pl.col("entity_type") == "user")["entity_id"].to_list())
    changed = users[::10][:2]  # 10% of the 20 users
    assert len(users) == 20 and len(changed) == 2

    nothing = run_incremental(cfg)  # unchanged data: nothing regenerated
    assert (nothing.generated, nothing.entities_new, nothing.entities_changed) == (0, 0, 0)
    assert nothing.entities_unchanged == first.entities_new and nothing.previous_watermark == first.watermark

    edit_users(data, changed)
    second = run_incremental(cfg)
    assert second.status == "succeeded" and second.entities_changed == 2 and second.generated == 2
    assert second.entities_new == 0 and second.old_generated == 0
    assert second.watermark == first.watermark + 100 and second.users_after_watermark == 1
    after = read_knowledge(out / "knowledge")
    regenerated = after.filter(pl.col("run_id") == second.run_id)
    assert sorted(regenerated["entity_id"]) == changed and set(regenerated["entity_type"]) == {"user"}
    old_rows = after.filter(pl.col("run_id") != second.run_id)
    assert old_rows.equals(before)  # earlier rows are kept as they were

    # the ledger: four columns a scheduler reads, one row per run, in order
    recs = RunLedger(out).records()
    assert [r.run_id for r in recs] == [first.run_id, nothing.run_id, second.run_id]
    assert [r.status for r in recs] == ["succeeded"] * 3 and all(r.finished >= r.started for r in recs)
    assert len({r.config_hash for r in recs}) == 1 and {r.decoder for r in recs} == {"laser"}

    # the latest view: one row per entity, the changed users' rows from the second run
    latest = read_latest(out)
    keys = list(zip(latest["entity_type"], latest["entity_id"]))
    assert len(keys) == len(set(keys))
    new_keys = set(zip(after["entity_type"], after["entity_id"]))
    old_keys = set(zip(*read_knowledge(out / "old_knowledge").select("entity_type", "entity_id")))
    assert set(keys) == new_keys | old_keys
    lk = latest.filter(pl.col("store") == "knowledge")
    assert {i for i, r in zip(lk["entity_id"], lk["run_id"]) if r == second.run_id} == set(changed)
    assert set(lk["entity_id"]) == set(after["entity_id"])

    # the feature store, materialized incrementally, serves the changed users' new knowledge
    _, done = ingest(out)
    assert done["user_knowledge"] == "incremental"
    got = online_features(repo.store(), "user", users, ("knowledge", "run_id"))
    want = latest.filter(pl.col("entity_type") == "user").sort("entity_id")
    assert got["knowledge"] == want["knowledge"].to_list() and got["user_id"] == want["entity_id"].to_list()
    assert {u for u, r in zip(got["user_id"], got["run_id"]) if r == second.run_id} == set(changed)
