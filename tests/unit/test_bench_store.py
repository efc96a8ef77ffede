"""`laser bench store` (benchmarks/store.py): runs on a small store and reports what it measured."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from jobs.cli import app


def test_bench_store_writes_its_table_and_json(tmp_path):
    out = tmp_path / "store-scale.json"
    res = CliRunner().invoke(app, ["bench", "store", "--sizes", "600", "--json", str(out), "--work", str(tmp_path)])
    assert res.exit_code == 0, res.output
    [r] = json.loads(out.read_text())["results"]
    assert (r["rows"], r["shards_written"], r["commits"]) == (600, 3, 3)
    assert 0 < r["commit_bytes_mean"] < 400 and r["old_commit_bytes_at_end"] > r["commit_bytes_mean"]
    assert "| 600 |" in res.output and "index cold s" in res.output
