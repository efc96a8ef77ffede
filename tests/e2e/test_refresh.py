"""Scheduled runs that stay true, end to end on a tiny random Llama and local Ray (issue scenarios):
a heavy user's newest interaction reaches their knowledge, a first run pays one LLM pass, a config
change regenerates (or, with --keep-existing, keeps and counts), a refresh drafts from each entity's
own earlier text, and rows are stamped with the run sequence."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.knowledge.job import run_job
from pipelines.store.knowledge import read_knowledge
from pipelines.ops.schedule.latest import read_latest
from tests.e2e.test_schedule_incremental import incremental_config, write_table_data

pytestmark = pytest.mark.slow


def _add_interaction(data, user: str) -> None:
    """One new interaction (an item the user has not seen, after every other) for ``user``."""
    inter = pl.read_parquet(data / "interactions.parquet")
    seen = inter.filter(pl.col("user_id") == user)["item_id"].implode()
    item = inter.filter(~pl.col("item_id").is_in(seen))["item_id"].min()
    row = (
        inter.filter(pl.col("user_id") == user)
        .tail(1)
        .with_columns(
            item_id=pl.lit(item, dtype=inter.schema["item_id"]),
            rating=pl.lit(5.0),
            timestamp=pl.lit(int(inter["timestamp"].max()) + 60, dtype=inter.schema["timestamp"]),
        )
    )
    pl.concat([inter, row]).write_parquet(data / "interactions.parquet")


def test_heavy_user_refreshes_and_first_run_pays_one_pass(tiny_model, ray_session, tmp_path):
    data = write_table_data(tmp_path / "data", n_users=12)
    out = tmp_path / "job"
    cfg = incremental_config(tiny_model, data, out, "split.max_hist=2", "generation.degenerate=keep")
    first = run_job(cfg, incremental=True)
    rec = first.record
    assert rec.old_generated == 0 and not (out / "old_knowledge").exists()  # no second LLM pass for the pools
    assert rec.generated == rec.entities_new > 0
    inter = pl.read_parquet(data / "interactions.parquet")
    heavy = inter.group_by("user_id").len().sort(["len", "user_id"])["user_id"][-1]
    assert inter.filter(pl.col("user_id") == heavy).height >= 2 * 2 - 1  # the paper split never refreshed it

    _add_interaction(data, heavy)
    second = run_job(cfg, incremental=True).record
    assert (second.entities_changed, second.generated, second.entities_new) == (1, 1, 0)
    rows = read_knowledge(out / "knowledge").filter(pl.col("run_id") == second.run_id)
    assert rows["entity_id"].to_list() == [heavy]
    assert rows["run_seq"].to_list() == [second.seq] and second.seq == rec.seq + 1
    assert rows["own_accepted_tokens"].null_count() == 0  # its earlier text was drafted from (and counted)
    latest = read_latest(out)
    assert latest.filter(pl.col("entity_id") == heavy)["run_id"].item() == second.run_id


def test_config_change_regenerates_or_is_kept_and_counted(tiny_model, ray_session, tmp_path):
    data = write_table_data(tmp_path / "data", n_users=6)
    out = tmp_path / "job"
    plain = incremental_config(tiny_model, data, out, "decoder.name=autoregressive", "decoder.params={}")
    first = run_job(plain).record
    n = first.generated
    assert n > 0 and first.status == "succeeded"

    laser_cfg = incremental_config(tiny_model, data, out)  # the same data, another decoder
    kept = run_job(laser_cfg, keep_existing=True)
    assert kept.record.generated == 0 and kept.other_config == n  # kept, and said how many
    redo = run_job(laser_cfg, incremental=True)
    assert redo.record.generated == redo.record.entities_changed == n and redo.other_config == n
    latest = read_latest(out)
    assert set(latest.filter(pl.col("store") == "knowledge")["decoder"]) == {"laser"}  # no row of the old config left
    again = run_job(laser_cfg, incremental=True).record
    assert again.generated == 0 and again.entities_unchanged == n
