"""laser bench driver: the job's driver and Ray Data map_batches decode the same requests, every one once."""

from __future__ import annotations

import json

from jobs.config import load_config
from benchmarks.driver import DriverBenchSettings, run_driver_bench


def test_driver_bench_on_a_tiny_model(tiny_model, ray_session, tmp_path):
    cfg = load_config(
        None,
        [
            "dataset.format=synthetic",
            "dataset.synthetic.n_users=6",
            "dataset.synthetic.n_items=8",
            "dataset.synthetic.max_history=6",
            "split.max_hist=3",
            "model.dtype=float32",
        ],
    )
    s = DriverBenchSettings(model=tiny_model, workers=1, threads=1, slots=2, max_new_tokens=4, repeats=1)
    report = run_driver_bench(tmp_path / "d.json", cfg, s)
    assert report["requests"] > 0
    for method in ("driver", "ray data"):
        (run,) = report["runs"][method]
        assert run["rows"] == report["requests"] and run["lost"] == 0 and run["duplicated"] == 0
        assert run["failed"] == 0 and run["n_tokens"] > 0
    assert json.loads((tmp_path / "d.json").read_text())["summary"]["ray data"]["speed_vs_driver"] > 0
    assert "| ray data |" in (tmp_path / "d.md").read_text() and (tmp_path / "d.png").stat().st_size > 1000
