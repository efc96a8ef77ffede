"""`laser bench scale`: the linear synthetic catalogue and the bench's stages, failures, projection and JSON."""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
import pytest

from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS
from pipelines.data.synthetic import scale_catalogue
from benchmarks import scale
from benchmarks.scale import Meter, ScaleSettings, StageRun


@pytest.fixture(scope="module")
def catalogue():
    return scale_catalogue(20_000, 2_000, mean_history=20, seed=3)


def test_catalogue_is_canonical_and_seeded(catalogue):
    ds = catalogue
    assert dict(ds.interactions.schema) == INTERACTIONS_SCHEMA
    assert dict(ds.items.schema) == ITEM_COLUMNS
    assert ds.users.columns == ["user_id", "age", "gender", "occupation"]
    assert ds.users["user_id"].n_unique() == 20_000 and ds.items["item_id"].n_unique() == 2_000
    inter = ds.interactions
    assert inter.select("user_id", "item_id").is_unique().all()
    assert inter["item_id"].is_in(ds.items["item_id"].implode()).all()
    assert inter["user_id"].is_in(ds.users["user_id"].implode()).all()
    assert inter["rating"].is_between(1, 5).all() and (inter["rating"] == inter["rating"].round()).all()
    steps = inter.select(pl.col("timestamp").diff().over("user_id").drop_nulls())
    assert (steps["timestamp"] > 0).all()  # strictly increasing per user, rows in time order
    assert (ds.items["category"] == ds.items["genres"].list.first()).all()
    assert ds.items["genres"].list.len().is_between(1, 3).all() and ds.items["title"].n_unique() == 2_000
    assert set(ds.users["gender"]) == {"F", "M"} and ds.users["occupation"].n_unique() > 5
    again = scale_catalogue(20_000, 2_000, mean_history=20, seed=3)
    assert again.interactions.equals(inter) and again.items.equals(ds.items) and again.users.equals(ds.users)
    assert not scale_catalogue(20_000, 2_000, mean_history=20, seed=4).interactions.equals(inter)


def test_activity_is_heavy_tailed(catalogue):
    counts = catalogue.interactions.group_by("user_id").len()["len"].to_numpy()
    assert 12 <= counts.mean() <= 22  # ~mean_history (a user's repeated picks of an item collapse)
    assert counts.max() >= 10 * np.median(counts)
    top = np.sort(counts)[::-1][: len(counts) // 100].sum() / counts.sum()
    assert top > 0.05  # the busiest 1% hold over 5% (an even spread: 1%, a Poisson one: about 2%)


def test_popularity_is_a_power_law(catalogue):
    counts = np.sort(catalogue.interactions.group_by("item_id").len()["len"].to_numpy())[::-1]
    ranks = np.arange(1, len(counts) + 1)
    head = slice(4, 400)
    slope = np.polyfit(np.log(ranks[head]), np.log(counts[head]), 1)[0]
    assert -1.3 <= slope <= -0.7  # P(rank r) ~ 1 / r
    assert counts[: len(counts) // 100].sum() / counts.sum() > 0.2


def test_catalogue_is_linear_no_users_by_items_allocation():
    """200K users x 100K items: a users x items matrix alone would take 20 GB (bool) or 160 GB (float)."""
    with Meter() as meter:
        ds = scale_catalogue(200_000, 100_000, mean_history=20, seed=0)
    if not meter.reset:
        pytest.skip("the peak resident memory cannot be reset here")
    assert ds.interactions.height > 3_000_000
    assert meter.peak_gb - meter.start_gb < 2.0
    assert meter.s < 60


def test_scale_catalogue_rejects_empty_sizes():
    with pytest.raises(ValueError, match="n_users"):
        scale_catalogue(0, 10)


def test_settings_reject_unknown_stages():
    with pytest.raises(ValueError, match="unknown stage"):
        ScaleSettings(stages=("load_split", "nope"))


def test_prerequisites_follow_needs_only():
    assert scale.with_prerequisites(("latest_view",)) == ["load_split", "plan", "store_write", "latest_view"]
    assert scale.with_prerequisites(("route",)) == ["load_split", "route"]


def test_flip_newest_changes_only_the_listed_users_newest_rating():
    inter = pl.DataFrame(
        {"user_id": ["a", "a", "b"], "item_id": ["x", "y", "x"], "rating": [5.0, 4.0, 2.0], "timestamp": [1, 2, 1]}
    )
    out = scale.flip_newest(inter, ["a"])
    assert out["rating"].to_list() == [5.0, 1.0, 2.0]


def _fake_spawn(results: dict[str, dict], calls: list[str]):
    def spawn(stage, root, timeout_s, max_gb):
        calls.append(stage)
        if stage == "generate":
            result = {"s": 0.1, "users": 90, "items": 10, "interactions": 900}
        else:
            result = dict(results.get(stage, {"s": 1.0, "peak_gb": 0.5}))
        (root / "results" / f"{stage}.json").write_text(json.dumps(result))
        return StageRun(result)

    return spawn


def test_merge_resumes_the_work_folder_reusing_what_the_selected_stages_need(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(scale, "spawn_stage", _fake_spawn({}, calls))
    out, work = tmp_path / "scale.json", tmp_path / "w"
    scale.run_scale_bench(out, ScaleSettings(sizes=(100,), stages=("plan",)), work=work)
    assert calls == ["generate", "load_split", "plan"]
    calls.clear()
    result = scale.run_scale_bench(out, ScaleSettings(sizes=(100,), stages=("store_write",)), work=work, merge=True)
    assert calls == ["store_write"]  # the catalogue, load_split and plan are reused
    assert result["sizes"]["100"]["setup"]["plan"]["reused"]
    calls.clear()
    scale.run_scale_bench(out, ScaleSettings(sizes=(100,), stages=("plan",), seed=1), work=work, merge=True)
    assert calls == ["generate", "load_split", "plan"]  # other data: nothing reused


def test_failed_stage_is_recorded_dependents_skipped_rest_run(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(
        scale,
        "spawn_stage",
        _fake_spawn(
            {"lightgcn": {"error": "out of memory: 13 GB"}, "store_write": {"error": "ValueError: bad row"}}, calls
        ),
    )
    result = scale.run_scale_bench(tmp_path / "scale.json", ScaleSettings(sizes=(100,)), work=tmp_path / "w")
    stages = result["sizes"]["100"]["stages"]
    assert stages["lightgcn"]["error"].startswith("out of memory")
    assert stages["route"]["s"] == 1.0  # uses lightgcn, runs without it (attribute groups)
    assert stages["store_write"]["error"] == "ValueError: bad row"
    for stage in ("latest_view", "pools", "incremental"):  # pools are built from the written store
        assert "store_write" in stages[stage]["skipped"] and stage not in calls
    assert result["sizes"]["100"]["total_s"] == pytest.approx(3.0)  # load_split, route, plan
    assert result["sizes"]["100"]["finished"] == ["load_split", "route", "plan"]
    assert json.loads((tmp_path / "scale.json").read_text())["sizes"]["100"]["stages"]["lightgcn"]["error"]


def test_sizes_projected_past_the_budget_are_skipped_and_failed_stages_not_retried(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(scale, "spawn_stage", _fake_spawn({"pools": {"error": "too slow"}}, calls))
    settings = ScaleSettings(sizes=(100, 1000, 100_000), stages=("load_split", "pools"), budget_s=50)
    result = scale.run_scale_bench(tmp_path / "scale.json", settings, work=tmp_path / "w")
    assert set(result["sizes"]) == {"100", "1000"}
    assert result["sizes"]["1000"]["stages"]["pools"]["skipped"].startswith("failed at 100 entities")
    assert result["skipped_sizes"]["100000"].startswith("projected 100 s > --budget-s 50")  # 1 s x 100 (linear)
    assert calls.count("pools") == 1


def test_merge_keeps_earlier_sizes_replaces_rerun_stages_and_projects_from_them(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(scale, "spawn_stage", _fake_spawn({}, calls))
    out = tmp_path / "scale.json"
    scale.run_scale_bench(out, ScaleSettings(sizes=(100,), stages=("load_split", "plan")), work=tmp_path / "w")
    result = scale.run_scale_bench(
        out, ScaleSettings(sizes=(100_000,), stages=("plan",), budget_s=500), work=tmp_path / "w", merge=True
    )
    assert result["skipped_sizes"]["100000"].startswith("projected 1000 s")  # from the file's 100
    assert result["sizes"]["100"]["total_s"] == 2.0
    monkeypatch.setattr(scale, "spawn_stage", _fake_spawn({"plan": {"s": 3.0, "peak_gb": 0.5}}, calls))
    result = scale.run_scale_bench(out, ScaleSettings(sizes=(100,), stages=("plan",)), work=tmp_path / "w", merge=True)
    entry = result["sizes"]["100"]
    assert entry["stages"]["load_split"]["s"] == 1.0 and entry["stages"]["plan"]["s"] == 3.0
    assert entry["total_s"] == 4.0


def test_slopes_between_consecutive_sizes():
    sizes = {
        str(n): {"total_s": s, "peak_gb": 1.0, "stages": {"plan": {"s": s, "peak_gb": 1.0}}}
        for n, s in ((10, 1.0), (100, 10.0), (1000, 1000.0))
    }
    assert scale.slopes(sizes)["plan"] == {"10-100": 1.0, "100-1000": 2.0}
    assert scale.slopes(sizes, "peak_gb")["plan"] == {"10-100": 0.0, "100-1000": 0.0}
    assert scale.project(sizes, "plan", 10_000) == pytest.approx(1000.0 * 100)  # slope 2 carried on
    assert set(scale.slopes(sizes)["total"]) == {"10-100", "100-1000"}
    sizes["1000"]["finished"] = ["plan", "pools"]  # another set of stages: no total slope to it
    assert set(scale.slopes(sizes)["total"]) == {"10-100"}


def test_a_stage_process_over_max_memory_or_time_is_killed_and_recorded(tmp_path):
    root = tmp_path / "1000"
    (root / "results").mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps({"sizes": [1000]}))
    run = scale.spawn_stage("generate", root, timeout_s=60, max_gb=0.001)
    assert run.result["error"].startswith("out of memory")
    assert json.loads((root / "results" / "generate.json").read_text())["error"] == run.result["error"]
    big = tmp_path / "5000000"  # 5M entities: generation takes far longer than a second
    (big / "results").mkdir(parents=True)
    (big / "settings.json").write_text(json.dumps({"sizes": [5_000_000]}))
    slow = scale.spawn_stage("generate", big, timeout_s=1, max_gb=8)
    assert slow.result["error"].startswith("too slow: still running after 1 s")
    crashed = scale.spawn_stage("load_split", root, timeout_s=60, max_gb=8)  # no tables: it raises
    assert "error" in crashed.result and "Error" in crashed.result["error"]


def test_bench_json_shape_at_tiny_sizes(tmp_path):
    """Real stage processes: generation and load + split at 200 and 400 entities."""
    out = tmp_path / "scale.json"
    started = time.perf_counter()
    scale.run_scale_bench(out, ScaleSettings(sizes=(200, 400), stages=("load_split",), budget_s=120))
    result = json.loads(out.read_text())
    assert time.perf_counter() - started < 120
    assert set(result["sizes"]) == {"200", "400"}
    entry = result["sizes"]["200"]
    assert entry["users"] == 180 and entry["items"] == 20 and entry["interactions"] > 180
    assert set(entry["stages"]) == {"load_split"} and entry["stages"]["load_split"]["s"] > 0
    assert entry["total_s"] == entry["stages"]["load_split"]["s"] and entry["peak_gb"] > 0
    assert set(result["slopes"]["load_split"]) == {"200-400"}
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_every_stage_runs_at_a_tiny_size(tmp_path):
    result = scale.run_scale_bench(
        tmp_path / "scale.json", ScaleSettings(sizes=(200,), budget_s=300), work=tmp_path / "w"
    )
    stages = result["sizes"]["200"]["stages"]
    assert [s for s in scale.STAGES if "s" not in stages[s]] == [], stages
    assert stages["store_write"]["rows"] == 200 and stages["latest_view"]["rows"] == 200
    inc = stages["incremental"]
    assert inc["changed"] == inc["changed_users"] == inc["planned"] == 2  # 1% of 180 users
    assert stages["route"]["collaborative"] and "collaborative" in stages["route"]["pool_kinds"]
    again = scale.run_scale_bench(
        tmp_path / "scale.json",
        ScaleSettings(sizes=(200,), stages=("plan", "store_write")),
        work=tmp_path / "w",
        merge=True,
    )  # the store of the first run exists
    assert again["sizes"]["200"]["stages"]["plan"]["planned"] == 200
    assert again["sizes"]["200"]["stages"]["store_write"]["rows"] == 200


def test_stages_under_a_minute_report_the_median_of_their_repeats(tmp_path, monkeypatch):
    calls: list[str] = []
    times = iter([5.0, 3.0, 9.0, 70.0])  # plan three times (median 5), store_write once (over a minute)

    def spawn(stage, root, timeout_s, max_gb):
        calls.append(stage)
        result = (
            {"s": 0.1, "users": 90, "items": 10, "interactions": 900}
            if stage in ("generate", "load_split")
            else {"s": next(times), "peak_gb": 1.0 + len(calls) / 10}
        )
        (root / "results" / f"{stage}.json").write_text(json.dumps(result))
        return StageRun(result)

    monkeypatch.setattr(scale, "spawn_stage", spawn)
    result = scale.run_scale_bench(
        tmp_path / "scale.json",
        ScaleSettings(sizes=(100,), stages=("plan", "store_write"), repeats=3),
        work=tmp_path / "w",
    )
    stages = result["sizes"]["100"]["stages"]
    assert calls == ["generate", "load_split", "plan", "plan", "plan", "store_write"]  # load_split: setup, once
    assert stages["plan"]["s"] == 5.0 and stages["plan"]["runs_s"] == [5.0, 3.0, 9.0]
    assert stages["plan"]["peak_gb"] == pytest.approx(1.5)  # the highest of the three
    assert stages["store_write"]["s"] == 70.0 and "runs_s" not in stages["store_write"]
