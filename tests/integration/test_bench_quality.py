"""laser bench quality: intervals, the relaxed-minus-greedy bootstrap and the report files (fake rows)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.quality import entity_quality, quality_columns
from benchmarks import quality as bq


def test_wilson_interval():
    lo, hi = bq.wilson(22, 23)
    assert lo == pytest.approx(0.790, abs=1e-3) and hi == pytest.approx(0.992, abs=1e-3)
    assert bq.wilson(0, 0) == (0.0, 1.0) and bq.wilson(0, 10)[0] == 0.0


def test_paired_bootstrap_of_a_known_difference():
    a, b = np.array([1.0] * 10 + [0.0] * 10), np.array([0.0] * 20)
    d = bq.paired_bootstrap(a, b, n=500)
    assert d["diff"] == 0.5 and d["lo"] < 0.5 < d["hi"] and d["lo"] > 0.2
    same = bq.paired_bootstrap(a, a, n=100)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0}


def _row(eid: str, text: str, finish: str, retry: bool = False) -> dict:
    hist = [("Heat (1995)", 4.0, ("Action", "Crime"))]
    q = entity_quality(text, finish, "user", hist, None, 30)
    return {
        "entity_type": "user",
        "entity_id": eid,
        "knowledge": text,
        "n_tokens": 10,
        "greedy_retry": retry,
        **quality_columns(q),
    }


def test_report_markdown_and_png(tmp_path):
    greedy = [_row("u1", "This user enjoys crime films.", "eos"), _row("u2", "This user enjoys action and", "length")]
    relaxed = [
        _row("u1", "This user enjoys crime films.", "eos"),
        _row("u2", "This user enjoys westerns westerns westerns westerns westerns westerns.", "eos", True),
    ]
    rows = {"autoregressive greedy": greedy, bq.GREEDY_REF: greedy, bq.RELAXED: relaxed}
    from pipelines.config import JobConfig

    report = bq._report(
        rows,
        {k: 1.0 for k in rows},
        bq.QualityBenchSettings(bootstrap=200),
        JobConfig(),
        [("user", "u1"), ("user", "u2")],
        "demo.yaml",
    )
    m = report["methods"][bq.RELAXED]
    assert (m["ended"], m["cut"], m["degenerate"], m["retried"], m["flag_contradictions"]) == (2, 0, 1, 1, 0)
    assert report["laser_greedy_identical_to_autoregressive"] == {"hf": "2/2"}
    diffs = report["differences"]["laser relaxed - laser greedy"]
    assert diffs["degenerate"]["diff"] == 0.5
    assert diffs["grounding"]["diff"] == -0.5  # 1 of 2 facts against 2 of 2
    assert diffs["same_texts"] == "1/2"  # u1's texts are the same, u2's differ
    bq._write(tmp_path / "q.json", report)
    assert json.loads((tmp_path / "q.json").read_text())["entities"] == 2
    md = (tmp_path / "q.md").read_text()
    assert "| laser relaxed | 2 | 100.0%" in md and "| degenerate | +0.500 |" in md
    assert (tmp_path / "q.png").stat().st_size > 1000


def test_two_engines_are_compared_method_by_method():
    from pipelines.config import JobConfig

    ok = [_row(f"u{i}", "This user enjoys crime films.", "eos") for i in range(8)]
    cut = [_row(f"u{i}", "This user enjoys action and", "length") for i in range(8)]
    engines = ("hf", "vllm")
    settings = bq.QualityBenchSettings(bootstrap=200, engines=engines)
    chosen = [("user", f"u{i}") for i in range(8)]

    def report(vllm_rows):
        rows = {
            bq.label(e, m, engines): (vllm_rows if e == "vllm" else ok)
            for e in engines
            for m, _, _ in bq.methods(JobConfig())
        }
        return bq._report(rows, {k: 1.0 for k in rows}, settings, JobConfig(), chosen, "demo.yaml")

    same = report(ok)["differences"]["vllm: laser relaxed - hf: laser relaxed"]
    assert same["equal"] and same["same_texts"] == "8/8"
    worse = report(cut)["differences"]["vllm: laser greedy - hf: laser greedy"]
    assert not worse["equal"] and worse["cut"]["diff"] == 1.0 and worse["same_texts"] == "0/8"
    assert "hf: laser relaxed - hf: laser greedy" in report(ok)["differences"]


def test_flag_contradiction_check():
    assert not bq.flag_contradicts({"degenerate": True, "repeat_4gram": 0.2, "n_words": 8})
    assert bq.flag_contradicts({"degenerate": False, "repeat_4gram": 0.2, "n_words": 8})  # the stored 0.2
