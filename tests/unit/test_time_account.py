"""A run's time account (pipelines/knowledge/time_account.py): phases that add up to the wall, the engine's
share split by its own clock, fixed costs, and the round trip through summary.json."""

from __future__ import annotations

import time

import pytest

from pipelines.knowledge.time_account import PHASES, EngineTime, TimeAccount


def _engine(**kw) -> EngineTime:
    base = dict(wall_s=50.0, startup_s=10.0, writing_s=2.0, busy_s=60.0, decode_s=40.0, retry_share=0.25, actors=2)
    return EngineTime(**{**base, **kw})


def test_a_generation_pass_splits_by_the_engine_clock_and_adds_up():
    acc = TimeAccount()
    acc.add("load", 3.0)
    acc.generation(_engine())
    s = acc.seconds
    assert s["startup"] == 10.0 and s["writing"] == 2.0
    # 38 s of engine wall left; 2 actors side by side: 30 s of engine work, 8 s not on the engine clock
    assert s["prefill"] == pytest.approx(10.0)  # (60 - 40) / 2
    assert s["first decode"] == pytest.approx(15.0) and s["retries"] == pytest.approx(5.0)
    assert s["generation other"] == pytest.approx(8.0)
    assert sum(v for k, v in s.items() if k != "load") == pytest.approx(50.0)


def test_an_engine_clock_longer_than_the_wall_is_scaled_into_it():
    acc = TimeAccount()
    acc.generation(_engine(busy_s=200.0, decode_s=100.0, retry_share=0.0, actors=1))
    s = acc.seconds
    assert s["prefill"] + s["first decode"] == pytest.approx(38.0)  # never more than the pass's wall
    assert s["prefill"] == pytest.approx(s["first decode"])
    assert s.get("generation other", 0.0) == 0.0


def test_a_pass_timed_as_a_phase_moves_only_its_startup_out():
    acc = TimeAccount()
    acc.add("old knowledge", 50.0)
    acc.generation(_engine(), phase="old knowledge")
    assert acc.seconds == {"old knowledge": 40.0, "startup": 10.0}


def test_close_puts_what_no_phase_timed_into_other_and_fixed_excludes_decoding():
    acc = TimeAccount()
    with acc.phase("load"):
        pass
    acc.generation(_engine())
    acc.close()
    acc.wall_s = 60.0  # as if the run took a minute
    acc.seconds["other"] = 60.0 - sum(v for k, v in acc.seconds.items() if k != "other")
    assert sum(acc.seconds.values()) == pytest.approx(acc.wall_s)
    assert acc.fixed_s == pytest.approx(60.0 - 30.0)  # prefill 10, first decode 15, retries 5
    assert [k for k, _ in acc.ordered()] == [k for k in PHASES if acc.seconds.get(k)]


def test_round_trip_and_bad_input():
    acc = TimeAccount(seconds={"load": 1.5, "startup": 2.0}, wall_s=4.0, engine_ready_s=9.0)
    back = TimeAccount.from_json(acc.to_json())
    assert back.seconds == acc.seconds and back.wall_s == 4.0 and back.engine_ready_s == 9.0
    assert back.fixed_s == 4.0
    with pytest.raises(ValueError, match="unknown phase 'lunch'"):
        acc.add("lunch", 1.0)
    with pytest.raises(ValueError, match="'seconds' is list"):
        TimeAccount.from_json({"seconds": [1.0], "wall_s": 1.0})


def test_a_phase_timed_inside_another_is_counted_once():
    acc = TimeAccount()
    with acc.phase("load"):
        with acc.phase("startup"):
            time.sleep(0.05)
    assert acc.seconds["startup"] >= 0.05 and acc.seconds["load"] < 0.05
