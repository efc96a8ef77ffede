"""`laser bench engines`: cold then warm runs interleaved per row, the median warm run per row, JSON, Markdown
and PNG; the command of each row; Ray Data LLM's per-pass figures (the runs themselves are replaced by
recorded figures here: tests/integration/test_bench_ray_data_llm.py runs the Ray Data LLM row)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from benchmarks import engines
from benchmarks.ray_data_llm import engine_ready, pass_figures, speculative_config


def _fake_run(walls):
    calls = []

    def timed_job(config, engine, out, log_path, overrides=(), env=None):
        calls.append((engine, env is not None, tuple(overrides)))
        wall = walls[engine][sum(1 for c in calls if c[0] == engine) - 1]
        new = {
            "entities": 20,
            "failed": 0,
            "wall_s": wall / 2,
            "tokens": 900,
            "entities_per_min": 2400 / wall,
            "tokens_per_s": 1800 / wall,
            "aal": 2.0,
            "running_entities_per_min": 4800 / wall,
        }
        return {
            "engine": engine,
            "wall_s": wall,
            "entities": 40,
            "entities_per_min": 2400 / wall,
            "old": new,
            "new": new,
        }

    return timed_job, calls


def test_cold_runs_first_then_warm_runs_interleave_and_the_median_warm_run_is_reported(tmp_path, monkeypatch):
    timed_job, calls = _fake_run({"hf": [120.0, 90.0, 60.0, 75.0], "ray-data-llm": [100.0, 50.0, 70.0, 40.0]})
    monkeypatch.setattr(engines, "timed_job", timed_job)
    monkeypatch.setattr(engines, "check_engines", lambda rows: None)
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "laser-cache"))
    out = tmp_path / "engines.json"
    engines.run_engines_bench(
        out,
        tmp_path / "demo.yaml",
        tmp_path / "work",
        ("hf", "ray-data-llm"),
        repeats=3,
        overrides=["dataset.path=/data/ml-1m"],
    )
    assert [c[0] for c in calls] == ["hf", "ray-data-llm"] * 4
    assert all(c[1] and c[2] == ("dataset.path=/data/ml-1m",) for c in calls)  # own caches, the overrides
    # each row's compile caches live under work/caches/<row>; the LASER cache links the machine's models
    assert (tmp_path / "work" / "caches" / "hf" / "laser" / "models").is_symlink()
    saved = json.loads(out.read_text())
    assert [r["phase"] for r in saved["runs"]] == ["cold"] * 2 + ["warm"] * 6
    assert saved["cold_runs"]["hf"]["wall_s"] == 120.0 and saved["cold_runs"]["ray-data-llm"]["wall_s"] == 100.0
    assert saved["median"]["hf"]["wall_s"] == 75.0 and saved["median"]["ray-data-llm"]["wall_s"] == 50.0
    md = out.with_suffix(".md").read_text()
    assert "| hf | cold | 40 | 120.0 | 20.0 |" in md and "| ray-data-llm | warm | 40 | 50.0 | 48.0 |" in md
    assert "--set dataset.path=/data/ml-1m" in md
    assert out.with_suffix(".png").stat().st_size > 0


def test_without_cold_every_run_is_warm_on_the_machine_caches(tmp_path, monkeypatch):
    timed_job, calls = _fake_run({"hf": [90.0, 60.0], "vllm": [50.0, 70.0]})
    monkeypatch.setattr(engines, "timed_job", timed_job)
    monkeypatch.setattr(engines, "check_engines", lambda rows: None)
    out = tmp_path / "engines.json"
    engines.run_engines_bench(out, tmp_path / "demo.yaml", tmp_path / "work", ("hf", "vllm"), repeats=2, cold=False)
    assert [c[0] for c in calls] == ["hf", "vllm"] * 2 and not any(c[1] for c in calls)
    saved = json.loads(out.read_text())
    assert saved["cold_runs"] == {} and saved["median"]["vllm"]["wall_s"] == 50.0


def test_each_row_runs_its_own_fresh_process(tmp_path):
    job = engines.command(tmp_path / "c.yaml", "vllm", tmp_path / "out", ["dataset.limit_users=5"])
    assert job[:4] == [sys.executable, "-m", "jobs", "run"]
    # the row's engine and output come after the caller's overrides, so they win
    assert job[-6:] == [
        "--set",
        "dataset.limit_users=5",
        "--set",
        "execution.engine=vllm",
        "--set",
        f"output.path={tmp_path / 'out'}",
    ]
    rd = engines.command(tmp_path / "c.yaml", "ray-data-llm-ngram", tmp_path / "out", ["dataset.limit_users=5"])
    assert rd[1:4] == ["-m", "benchmarks.rows", "ray-data-llm"]
    assert rd[rd.index("--speculation") + 1] == "ngram" and rd[-2:] == ["--set", "dataset.limit_users=5"]
    with pytest.raises(ValueError, match="unknown engine row"):
        engines.check_engines(["hf", "ray-data"])


def test_speculative_configs_of_the_extra_rows():
    assert speculative_config("none") is None
    assert speculative_config("ngram") == {
        "method": "ngram",
        "num_speculative_tokens": 8,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert speculative_config("suffix")["method"] == "suffix"
    with pytest.raises(ValueError, match="speculation"):
        speculative_config("eagle")


def _five_batches():
    """The issue's hidden MovieLens-100K new pass: 69 entities in 5 batches of 16 from one engine; the first row
    left at 101.5 s of a 115.4 s pass, the others followed within 14 s."""
    sizes, times = [16, 16, 16, 16, 5], [101.5, 105.0, 108.5, 112.0, 115.4]
    arrivals = [(t, f"b{i}") for i, (n, t) in enumerate(zip(sizes, times)) for _ in range(n)]
    return [{"n_tokens": 96, "error": ""} for _ in arrivals], arrivals


def test_ray_data_running_rate_counts_from_the_engines_readiness_not_from_its_first_batch():
    got, arrivals = _five_batches()
    fig = pass_figures(got, arrivals, 115.4, engine_ready_s=61.2)
    assert fig["entities"] == 69 and fig["tokens"] == 69 * 96 and fig["batches"] == 5 and fig["first_row_s"] == 101.5
    assert fig["entities_per_min"] == pytest.approx(60 * 69 / 115.4)
    assert fig["engine_ready_s"] == 61.2
    assert fig["running_entities_per_min"] == pytest.approx(60 * 69 / (115.4 - 61.2))  # 76.4
    after_first_batch = 60 * 53 / (115.4 - 101.5)  # what the rows alone said: 229 a minute
    assert fig["running_entities_per_min"] < after_first_batch / 2.5
    failed = [{"n_tokens": 0, "error": "boom"}] + got[1:]
    assert pass_figures(failed, arrivals, 115.4, 61.2)["running_entities_per_min"] == pytest.approx(60 * 68 / 54.2)


@pytest.mark.parametrize("ready", [None, -1.0, 115.4])
def test_ray_data_running_rate_is_none_without_a_readiness_inside_the_pass(ready):
    got, arrivals = _five_batches()
    fig = pass_figures(got, arrivals, 115.4, ready)
    assert fig["running_entities_per_min"] is None and fig["entities"] == 69
    assert pass_figures([], [], 0.0, None)["running_entities_per_min"] is None


def _op(name, start):
    return SimpleNamespace(operator_name=name, earliest_start_time=start)


def test_engine_ready_is_the_earliest_batch_start_of_the_vllm_stage_in_ray_datas_stats():
    inputs = SimpleNamespace(operators_stats=[_op("FromItems", 1.0)], parents=[])
    stages = SimpleNamespace(
        operators_stats=[_op("Map(_preprocess)", 2.0), _op("MapBatches(vLLMEngineStageUDF)", 70.5)],
        parents=[inputs],
    )
    summary = SimpleNamespace(operators_stats=[_op("Map(_postprocess)", 101.0)], parents=[stages])
    assert engine_ready(summary) == 70.5
    two = SimpleNamespace(operators_stats=[_op("MapBatches(vLLMEngineStageUDF)", 64.0)], parents=[stages])
    assert engine_ready(two) == 64.0  # two vLLM stages: the first ready
    idle = SimpleNamespace(operators_stats=[_op("MapBatches(vLLMEngineStageUDF)", None)], parents=[inputs])
    assert engine_ready(idle) is None and engine_ready(inputs) is None


def test_the_decode_rates_of_the_job_passes_side_by_side():
    def summary_pass(decode):
        return {
            "done": 20,
            "failed": 0,
            "wall_s": 30.0,
            "n_tokens": 900,
            "tokens_per_s_wall": 30.0,
            "aal": 1.3,
            "decoded_tokens": 1000,
            "retries": 2,
            "tokens_per_s_decode": decode,
        }

    old, new = engines._pass(summary_pass(80.0)), engines._pass(summary_pass(100.0))
    assert engines._decode_cell(old, new) == "80.0 / 100.0 (1.25x)"
    assert engines._decode_cell(old, engines._pass(summary_pass(0.0))) == "-"  # not timed
    assert engines._decode_cell({"entities": 20}, new) == "-"  # a Ray Data LLM pass has no such figure
