"""Every entity's source hash from frames: equal to the requests' own, recomputed only where the prompt's inputs
changed since the cache was written, and the whole cache ignored when another polars or prompt version wrote it."""

from __future__ import annotations

import polars as pl
import pyarrow.parquet as pq
import pytest

import pipelines.knowledge.requests as requests_mod
from jobs.config import load_config
from pipelines.data.split import split_old_new
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.plan import classify, plan_run, to_generate
from pipelines.knowledge.requests import attach_payloads, drop_payloads, new_requests, request_keys


@pytest.fixture
def data():
    cfg = load_config(None, ["dataset.synthetic.n_users=30", "dataset.synthetic.n_items=20", "split.max_hist=5"])
    return load_job_data(cfg)


def _hashes(keys: pl.DataFrame) -> dict[tuple[str, str], str]:
    return {(t, i): h for t, i, h in keys.select("entity_type", "entity_id", "source_hash").iter_rows()}


@pytest.fixture
def exact_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = requests_mod._exact_hashes

    def counting(dataset, split, keys):
        calls.append(keys.height)
        return real(dataset, split, keys)

    monkeypatch.setattr(requests_mod, "_exact_hashes", counting)
    return calls


def test_keys_carry_the_requests_own_hashes(data):
    reqs = new_requests(data.dataset, data.split, {})
    assert _hashes(request_keys(data.dataset, data.split)) == {r.key: r.source_hash for r in reqs}
    assert len(reqs) == 30 + data.split.new_items.height


def test_only_entities_whose_inputs_changed_are_hashed_again(data, tmp_path, exact_calls):
    cache = tmp_path / "hashes.parquet"
    first = request_keys(data.dataset, data.split, cache)
    assert exact_calls == [first.height]
    again = request_keys(data.dataset, data.split, cache)
    assert exact_calls == [first.height] and _hashes(again) == _hashes(first)  # nothing recomputed

    user = data.split.prompt_interactions["user_id"][0]  # one rating in the history of one user edited in place
    ds = data.dataset
    newest = pl.col("timestamp") == pl.col("timestamp").filter(pl.col("user_id") == user).max()
    ds.interactions = ds.interactions.with_columns(
        rating=pl.when((pl.col("user_id") == user) & newest).then(6.0 - pl.col("rating")).otherwise(pl.col("rating"))
    )
    item = data.split.new_items["item_id"][0]  # one item retitled
    ds.items = ds.items.with_columns(
        title=pl.when(pl.col("item_id") == item).then(pl.lit("Another Title")).otherwise(pl.col("title"))
    )
    data.split = split_old_new(ds, max_hist=5, mode="latest")
    edited = request_keys(data.dataset, data.split, cache)
    changed = {k for k, h in _hashes(edited).items() if _hashes(first)[k] != h}
    users_showing_item = set(data.split.prompt_interactions.filter(pl.col("item_id") == item)["user_id"])
    assert changed == {("user", user), ("item", item)} | {("user", u) for u in users_showing_item}
    assert exact_calls[1] == len(changed)  # those alone were hashed again
    want = {r.key: r.source_hash for r in new_requests(data.dataset, data.split, {})}
    assert _hashes(edited) == want


def test_a_cache_from_another_polars_is_ignored(data, tmp_path, exact_calls):
    cache = tmp_path / "hashes.parquet"
    keys = request_keys(data.dataset, data.split, cache)
    table = pq.read_table(cache)
    pq.write_table(table.replace_schema_metadata({b"polars": b"0.0.1", b"prompt_version": b"x"}), cache)
    request_keys(data.dataset, data.split, cache)
    assert exact_calls == [keys.height, keys.height]


def test_a_run_plan_builds_requests_for_the_planned_entities_alone(data, tmp_path):
    index = pl.DataFrame(
        schema={
            "entity_type": pl.Utf8,
            "entity_id": pl.Utf8,
            "source_hash": pl.Utf8,
            "config_hash": pl.Utf8,
            "run_id": pl.Utf8,
            "run_seq": pl.Int64,
            "generated_at": pl.Datetime("us", "UTC"),
        }
    )
    first = plan_run(data.dataset, data.split, None, "routed", index, "c", tmp_path / "h.parquet")
    assert first.new == len(first.todo) == 30 + data.split.new_items.height
    items = [r for r in first.todo if r.entity_type == "item"]
    attach_payloads(data.dataset, data.split, items)
    assert all(
        r.item == full
        for r in items
        for full in [data.split.new_items.filter(pl.col("item_id") == r.entity_id).to_dicts()[0]]
    )
    keep = [r for r in first.todo if r.entity_id not in ("u0001", "u0002")]  # rows written for all but two
    index = pl.DataFrame([(*r.key, r.source_hash, "c", "r1", 1, None) for r in keep], schema=index.schema, orient="row")
    second = plan_run(data.dataset, data.split, None, "routed", index, "c", tmp_path / "h.parquet")
    assert sorted(r.key for r in second.todo) == [("user", "u0001"), ("user", "u0002")]
    assert (second.new, second.unchanged) == (2, len(keep))
    assert all(r.history is None for r in second.todo)  # planned without prompt inputs: a batch at a time
    attach_payloads(data.dataset, data.split, second.todo)
    full = {r.key: r for r in new_requests(data.dataset, data.split, {})}
    assert all(r.history == full[r.key].history and r.source_hash == full[r.key].source_hash for r in second.todo)
    drop_payloads(second.todo)
    assert all(r.history is None for r in second.todo)
    classified = classify(request_keys(data.dataset, data.split), index, "other")  # another config: all again
    assert to_generate(classified).height == first.new
