"""ctr-eval's 95% intervals, paired differences, verdict sentence, Markdown and PNG (made-up run results)."""

from __future__ import annotations

import json
import math

import pytest

from pipelines.ctr.compare import RunResult, summarise
from pipelines.ctr.evaluate import nan_to_none, verdict_text
from pipelines.ctr.compare import mean_ci95
from pipelines.ctr.report import markdown, plot


def test_mean_ci95_is_the_student_t_interval_over_seeds():
    lo, hi = mean_ci95([1.0, 2.0, 3.0])
    # mean 2, sample sd 1, t(0.975, 2) = 4.302653
    assert (lo, hi) == pytest.approx((2 - 4.302653 / math.sqrt(3), 2 + 4.302653 / math.sqrt(3)), abs=1e-5)
    assert mean_ci95([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert all(math.isnan(v) for v in mean_ci95([0.7]))
    assert mean_ci95([1.0, float("nan"), 3.0]) == pytest.approx((2 - 12.7062, 2 + 12.7062), abs=1e-3)


def _runs():
    rows = []
    for seed, (none, greedy, relaxed) in enumerate([(0.70, 0.75, 0.751), (0.71, 0.77, 0.768), (0.69, 0.76, 0.762)]):
        for model, shift in (("din", 0.0), ("dcnv2", -0.01)):
            rows += [
                RunResult("none", model, seed, none + shift, 0.60, 1, 0.6),
                RunResult("greedy", model, seed, greedy + shift, 0.55 - seed * 0.01, 1, 0.55),
                RunResult("relaxed", model, seed, relaxed + shift, 0.55 - seed * 0.01, 1, 0.55),
            ]
    return rows


def test_summarise_pairs_differences_by_seed_with_intervals():
    out = summarise(_runs(), reference="greedy", tolerance=0.002)
    din = out["table"]["greedy"]["din"]
    assert din["auc_mean"] == pytest.approx(0.76)
    assert din["auc_ci95"] == pytest.approx(list(mean_ci95([0.75, 0.77, 0.76])))
    assert din["logloss_ci95"] == pytest.approx(list(mean_ci95([0.55, 0.54, 0.53])))
    assert set(out["deltas"]) == {"greedy", "relaxed"}
    assert set(out["deltas"]["greedy"]) == {"vs_none"}  # no self-comparison
    assert set(out["deltas"]["relaxed"]) == {"vs_none", "vs_greedy"}
    g = out["deltas"]["greedy"]["vs_none"]["din"]
    assert g["auc"] == pytest.approx(0.06) and g["n"] == 3
    assert g["auc_ci95"] == pytest.approx(list(mean_ci95([0.05, 0.06, 0.07])))
    assert g["auc_ci95"][0] > 0  # greedy clearly above none
    r = out["deltas"]["relaxed"]["vs_greedy"]["dcnv2"]
    assert r["auc"] == pytest.approx(0.001 / 3) and r["auc_ci95"][0] < 0 < r["auc_ci95"][1]
    assert r["logloss"] == pytest.approx(0.0) and r["logloss_ci95"] == pytest.approx([0.0, 0.0])
    assert out["verdicts"]["relaxed"]["lossless"] is True


def test_verdict_sentence_reads_the_intervals():
    text = verdict_text(summarise(_runs(), reference="greedy"))
    assert "greedy: DIN AUC vs none higher (+0.0600)" in text
    assert "relaxed:" in text and "DCNv2 AUC vs greedy not distinguishable" in text
    assert text.endswith("lossless vs greedy.")
    worse = [
        RunResult(r.source, r.model, r.seed, r.auc - (0.05 if r.source == "relaxed" else 0), r.logloss, 1, 0.5)
        for r in _runs()
    ]
    assert "DIN AUC vs greedy lower" in verdict_text(summarise(worse)) and "not lossless" in verdict_text(
        summarise(worse)
    )


def _result():
    summary = summarise(_runs(), reference="greedy")
    return nan_to_none(
        {
            "dataset": "toy",
            "sample": {"users": 3, "items": 4, "interactions": 12},
            "n_samples": 12,
            "positive_rate": 0.5,
            "encoder": "enc",
            "knowledge_rows": {"greedy": {"user": 3, "item": 4}},
            "config": {
                "models": ["din", "dcnv2"],
                "seeds": [0, 1, 2],
                "split_fractions": [0.8, 0.1, 0.1],
                "rating_threshold": 4,
                "dataset": {"min_positive_rating": 4.0},
            },
            **summary,
            "verdict": verdict_text(summary),
            "wall_s": 12.0,
        }
    )


def test_markdown_has_every_row_with_its_interval(tmp_path):
    res = _result()
    json.dumps(res, allow_nan=False)
    md = markdown(res)
    lo, hi = res["table"]["relaxed"]["dcnv2"]["auc_ci95"]
    assert f"| relaxed | DCNv2 | {res['table']['relaxed']['dcnv2']['auc_mean']:.4f} | [{lo:.4f}, {hi:.4f}] |" in md
    assert (
        md.count("\n| none | ") == 2
        and "| relaxed | greedy | DIN | " in md
        and "| greedy | none | DCNv2 | +0.0600 |" in md
    )
    assert "Sample: users 3, items 4, interactions 12." in md and "greedy 3 users + 4 items" in md
    assert "- relaxed: lossless" in md and "Verdict: greedy:" in md and "Wall time of ctr-eval: 12 s." in md


def test_markdown_and_plot_survive_a_missing_interval(tmp_path):
    res = _result()
    res["table"]["none"]["din"]["auc_ci95"] = [None, None]  # one seed, or a one-class test set
    assert "| none | DIN | " in markdown(res) and "| n/a |" in markdown(res)
    png = plot(res, tmp_path / "ctr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
