"""`laser bench engines`: runs interleaved per engine, the median run per engine, JSON and Markdown (the
job runs themselves are replaced by recorded figures here; the job on each engine is tested elsewhere)."""
from __future__ import annotations

import json

from pipelines.tools.bench import engines


def _fake_run(walls):
    calls = []

    def timed_job(config, engine, out, log_path):
        calls.append(engine)
        wall = walls[engine][sum(1 for c in calls if c == engine) - 1]
        new = {"entities": 20, "failed": 0, "wall_s": wall / 2, "tokens": 900, "entities_per_min": 2400 / wall,
               "tokens_per_s": 1800 / wall, "aal": 2.0}
        return {"engine": engine, "wall_s": wall, "entities": 40, "entities_per_min": 2400 / wall, "old": new, "new": new}

    return timed_job, calls


def test_runs_interleave_and_median_run_is_reported(tmp_path, monkeypatch):
    timed_job, calls = _fake_run({"hf": [90.0, 60.0, 75.0], "vllm": [50.0, 70.0, 40.0]})
    monkeypatch.setattr(engines, "timed_job", timed_job)
    out = tmp_path / "engines.json"
    engines.run_engines_bench(out, tmp_path / "demo.yaml", tmp_path / "work", ("hf", "vllm"), repeats=3)
    assert calls == ["hf", "vllm"] * 3
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 6
    assert saved["median"]["hf"]["wall_s"] == 75.0 and saved["median"]["vllm"]["wall_s"] == 50.0
    md = out.with_suffix(".md").read_text()
    assert "| hf | 40 | 75.0 | 32.0 |" in md and "| vllm | 40 | 50.0 | 48.0 |" in md
