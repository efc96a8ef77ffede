"""`laser bench throughput` end to end on a tiny model: every method at every concurrency, the targets,
the ceiling, and the JSON, Markdown and PNG outputs."""
from __future__ import annotations

import json

import pytest

from pipelines.tools.bench.throughput import GENERATE, ThroughputSettings, ceiling, run_throughput
from laser.cost import ForwardCost


def test_ceiling_is_the_best_per_token_time():
    cost = ForwardCost("k", [1, 4], [1, 8], [[0.02, 0.04], [0.03, 0.16]])
    ce = ceiling(cost, prompt_tokens=90, new_tokens=10)
    assert ce["best_seconds_per_token"] == pytest.approx(0.16 / 32)
    assert ce["tokens_per_s_with_prefill"] == pytest.approx(10 / (100 * 0.005))
    assert ce["decode_tokens_per_s"] == pytest.approx(200)


@pytest.mark.slow
def test_throughput_bench_on_a_tiny_model(tiny_model, tmp_path):
    settings = ThroughputSettings(model=tiny_model, threads=1, concurrency=(1, 3), min_prompts=3, max_new_tokens=8,
                                  old_users=8, fixed_K=(4,))
    out = tmp_path / "tp.json"
    report = run_throughput(out, settings, cache_root=tmp_path / "fixtures")
    assert set(report["levels"]) == {"1", "3"}
    for level in report["levels"].values():
        assert level[GENERATE]["speedup_vs_generate"] == pytest.approx(1.0)
        for name, m in level.items():
            assert m["tokens"] > 0 and m["prompts"] == 3 and m["decode_tokens_per_s"] >= m["tokens_per_s"] > 0
            if name != GENERATE:
                assert m["aal"] >= 1.0 and 0.0 <= m["rejected_draft_share"] <= 1.0
                assert m["efficiency_vs_cost_model"] > 0
    assert report["levels"]["3"]["autoregressive"]["mean_rows"] <= 3
    assert {t["target"] for t in report["targets"]} >= {"relaxed LASER (auto) never below generate"}
    saved = json.loads(out.read_text())
    assert saved["best"].keys() == report["levels"]["1"].keys()
    assert out.with_suffix(".png").stat().st_size > 0 and "| method |" in out.with_suffix(".md").read_text()
