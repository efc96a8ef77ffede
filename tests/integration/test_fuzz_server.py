"""The short fuzz run against a live vLLM server with LASER's plug-in (the long one: `laser bench fuzz-server`):
hostile LASER arguments never stop, stall or grow the server, and no request reads a store outside its roots."""

from __future__ import annotations

import pytest

from benchmarks.fuzz_server import FuzzSettings, run_fuzz


@pytest.mark.slow
def test_a_live_server_takes_300_hostile_requests_and_stays_up(tmp_path):
    report = run_fuzz(tmp_path, FuzzSettings(hostile=300, seed=1), progress=lambda line: None)
    f = report["figures"]
    assert report["unexpected"] == [], report["unexpected"]  # every answer 200 or 400
    assert f["read_control_worked"], "the read attack must work on the allowed store, else the check proves nothing"
    assert f["read_attacks"] > 10 and f["secret_leaked"] == 0
    assert f["statuses"].get("400", 0) > 100 and f["statuses"].get("200", 0) > 10  # refused and served both
    assert all(report["passed"].values()), (report["passed"], f)
