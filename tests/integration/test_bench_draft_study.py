"""The draft study of `laser bench suite`: Table 1 metrics by hand, targets, and the study end to end on a
tiny random model (no timing claims)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import laser
from laser import DecodeStats
from benchmarks.draft_study import (
    GENERATE,
    SPEC,
    draft_targets,
    markdown_draft_table,
    metrics,
    plot_draft_study,
    print_draft_table,
    run_draft_study,
)
from benchmarks.report import Run


def test_metrics_by_hand():
    reference = [Run([1, 2, 3, 4], 2.0)]  # 2 tokens/s
    st = DecodeStats(
        target_forwards=2, accepted_per_step=[3, 1], drafted_per_step=[4, 4], decode_s=0.8, retrieval_s=0.2
    )
    m = metrics([Run([1, 2, 3, 4, 5, 6], 1.0, st)], reference)
    assert m["acceptance_rate"] == pytest.approx(4 / 8)  # accepted / proposed (the paper's alpha)
    assert m["aal"] == pytest.approx((4 + 2) / 2)
    assert m["speedup"] == pytest.approx(6.0 / 2.0)
    assert m["drafting_share"] == pytest.approx(0.25)
    assert m["identical_to_generate"] is False


def test_targets_are_judged_on_their_figures():
    row = lambda **kw: {"speedup": 1.0, "identical_to_generate": True, "acceptance_rate": 0.2, **kw}  # noqa: E731
    result = {
        "settings": {"ks": [1, 50]},
        "temperatures": {
            "0": {SPEC: row(speedup=1.3)},
            "1": {SPEC: row(acceptance_rate=0.2), "topk_imp K=50 paper": row(acceptance_rate=0.3)},
        },
    }
    greedy, hot = draft_targets(result)
    assert greedy["met"] and greedy["value"] == pytest.approx(1.3)
    assert not hot["met"] and hot["value"] == pytest.approx(1.5)
    result["temperatures"]["0"][SPEC]["identical_to_generate"] = False
    assert not draft_targets(result)[0]["met"]  # fast but not lossless is a miss


@pytest.mark.slow
def test_study_end_to_end_on_a_tiny_model(tmp_path):
    lm = laser.tiny_llama(vocab_size=96, layers=2, seed=3)
    result = run_draft_study(
        lm,
        {"u1": [2, 3, 4, 5, 6]},
        draft="truncate:1",
        gamma=3,
        ks=(5,),
        temperatures=(0.0, 1.0),
        max_new_tokens=10,
        seed=0,
    )
    greedy, hot = result["temperatures"]["0"], result["temperatures"]["1"]
    names = [GENERATE, SPEC, "topk_imp K=5 paper", "topk_imp K=5 lossless"]
    assert list(greedy) == list(hot) == names
    assert all(greedy[n]["identical_to_generate"] for n in names)  # greedy decoding is lossless
    for n in names[1:]:
        assert 0.0 <= hot[n]["acceptance_rate"] <= 1.0 and 1.0 <= hot[n]["aal"] <= 4.0
        if n.startswith("topk_imp"):  # the paper's count: every passed test, an accepted y != x included
            assert hot[n]["tested"] > 0 and hot[n]["passed"] >= hot[n]["accepted"]
            assert "paper_acceptance_rate" not in greedy[n]  # greedy takes the greedy rule: no tests
        assert 0.0 < hot[n]["drafting_share"] < 1.0
    console = Console(record=True, width=160)
    print_draft_table(result, console)
    assert "topk_imp K=5 lossless" in console.export_text() and "spec_sampling" in markdown_draft_table(result)
    assert plot_draft_study(result, tmp_path / "d.png").stat().st_size > 1000
    json.dumps(result)  # the report is JSON as it stands
