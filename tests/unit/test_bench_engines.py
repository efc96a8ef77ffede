"""`laser bench engines`: cold then warm runs interleaved per row, the median warm run per row, JSON, Markdown
and PNG; the command of each row; Ray Data LLM's per-pass figures (the runs themselves are replaced by
recorded figures here: tests/integration/test_bench_ray_data_llm.py runs the Ray Data LLM row)."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import engines
from benchmarks.ray_data_llm import pass_figures, speculative_config


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


def test_ray_data_pass_figures_take_each_engines_first_batch_out_of_the_running_rate():
    got = [{"n_tokens": 10, "error": ""} for _ in range(8)]
    # two engines: batches a and b arrive first (they paid the engines' start), then c and d
    arrivals = [(60.0, "a"), (60.0, "a"), (62.0, "b"), (62.0, "b"), (72.0, "c"), (72.0, "c"), (82.0, "d"), (82.0, "d")]
    fig = pass_figures(got, arrivals, 83.0, engines=2)
    assert fig["entities"] == 8 and fig["tokens"] == 80 and fig["batches"] == 4 and fig["first_row_s"] == 60.0
    assert fig["entities_per_min"] == pytest.approx(60 * 8 / 83.0)
    assert fig["running_entities_per_min"] == pytest.approx(60 * 4 / 20.0)  # 4 rows over 62 s -> 82 s
    assert pass_figures(got[:4], arrivals[:4], 63.0, engines=2)["running_entities_per_min"] is None
    failed = [{"n_tokens": 0, "error": "boom"}] + got[1:]
    assert pass_figures(failed, arrivals, 83.0, engines=2)["failed"] == 1


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
