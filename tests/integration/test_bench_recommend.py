"""`laser bench recommend` end to end on a tiny model: tables, JSON, Markdown, PNG, strict == beam."""

from __future__ import annotations

import json

from benchmarks import recommend as bench
from pipelines.data.config import DatasetConfig, SyntheticParams


def test_bench_recommend_end_to_end(tiny_model, tmp_path):
    s = bench.RecommendBenchSettings(
        model=tiny_model,
        draft="truncate:1",
        aligned_strict="truncate:1",
        Ks=(1, 3, 50),
        users=2,
        dsbd_prompts=1,
        dsbd_tokens=4,
        seeds=(0,),
        dataset=DatasetConfig(
            format="synthetic", seed=1, synthetic=SyntheticParams(n_users=8, n_items=12, n_clusters=2, max_history=8)
        ),
    )
    res = bench.run_recommend_bench(tmp_path / "rec.json", s)
    assert set(res["K"]) == {1, 3}  # K=50 exceeds the 12 items: skipped
    for K, rows in res["K"].items():
        assert set(rows) == {"beam", "atspeed strict", "atspeed strict (aligned)", "atspeed relaxed"}
        assert rows["atspeed strict"]["same_as_beam"] and rows["atspeed strict (aligned)"]["same_as_beam"]
        assert rows["beam"]["steps_per_forward"] == 1.0
        assert all(len(items) == K for items in rows["beam"]["items"])
    assert set(res["dsbd"]["methods"]) >= {"beam_sample", "dsbd"}
    saved = json.loads((tmp_path / "rec.json").read_text())
    assert set(saved["K"]) == {"1", "3"}
    md = (tmp_path / "rec.md").read_text()
    assert "| 3 | atspeed strict |" in md and "DSBD against beam sampling" in md
    assert (tmp_path / "rec.png").stat().st_size > 0
