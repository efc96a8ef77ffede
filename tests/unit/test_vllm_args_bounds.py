"""Every LASER argument a client can send is bounded (laser/vllm/request_args.py): property tests over any
JSON value, and the admission check against the model's vocabulary and the engine's speculative tokens."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laser.vllm.request_args import LIMITS, PATH_MAX, VERSION, LaserArgs, LaserArgsError, Limits, check_admission

# any value JSON (or msgpack) can carry, huge integers, NaN and infinities included
_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=300) | st.just("/" * 5000)
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner), max_leaves=8
)
_fields = ("tag", "pool", "pool_store", "k", "p", "draft", "draft_len", "earlier", "n_max", "min_prob")
_keys = st.sampled_from(_fields) | st.sampled_from(["v", "x" * 3000]) | st.text(max_size=20)
_args = st.dictionaries(_keys, _values | st.integers(min_value=-(2**80), max_value=2**80))


def _safe(args: LaserArgs) -> None:
    """What a record the proposer may receive must hold (it reaches int64 arrays and per-step indexes)."""
    assert args.k is None or 1 <= args.k < 2**63
    assert args.draft_len == "auto" or 0 <= args.draft_len <= LIMITS.draft_len
    assert 1 <= args.n_max <= LIMITS.n_max
    assert args.earlier is None or (len(args.earlier) <= LIMITS.earlier and all(0 <= t < 2**63 for t in args.earlier))
    assert args.tag is None or len(args.tag) <= LIMITS.tag
    assert args.pool_store is None or 0 < len(args.pool_store) <= PATH_MAX  # a server remembers it per store
    assert args.p is None or 0.0 <= args.p <= 1.0
    assert 0.0 <= args.min_prob <= 1.0


@settings(max_examples=400, deadline=None)
@given(_args)
def test_any_arguments_are_accepted_and_safe_or_refused_in_one_line(raw):
    wire = {"laser": {"v": VERSION, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in raw.items()}}}
    try:
        args = LaserArgs.from_extra_args(wire, "q1")
    except LaserArgsError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("request q1: ") and len(str(exc)) < 600
        return
    _safe(args)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_json_text_is_accepted_or_refused_in_one_line(text):
    try:
        _safe(LaserArgs.from_extra_args({"laser": text}, "q2"))
    except LaserArgsError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(min_value=1, max_value=2**70),
    earlier=st.lists(st.integers(min_value=0, max_value=2**40), max_size=8),
    draft_len=st.integers(min_value=0, max_value=LIMITS.draft_len),
)
def test_admission_holds_k_and_earlier_to_the_vocabulary_and_draft_len_to_the_engine(k, earlier, draft_len):
    raw = {"laser": json.dumps({"v": VERSION, "k": k, "p": 0.1, "earlier": earlier, "draft_len": draft_len})}
    try:
        check_admission(raw, 0.0, vocab=49152, spec_tokens=8)
    except LaserArgsError as exc:
        assert "\n" not in str(exc)
        assert k > 49152 or any(t >= 49152 for t in earlier) or draft_len > 8, str(exc)
        return
    assert k <= 49152 and all(t < 49152 for t in earlier) and draft_len <= 8


def test_the_limits_are_the_servers_to_set():
    assert Limits.from_env({"LASER_MAX_N_MAX": "12", "LASER_MAX_EARLIER": "100"}) == Limits(n_max=12, earlier=100)
    assert Limits.from_env({}) == Limits()
    with pytest.raises(ValueError, match="LASER_MAX_TAG must be an integer >= 1, got 'many'"):
        Limits.from_env({"LASER_MAX_TAG": "many"})


def test_relaxed_needs_temperature_zero_at_admission():
    with pytest.raises(LaserArgsError, match="needs temperature 0"):
        check_admission({"laser": {"v": VERSION, "k": 2, "p": 0.1}}, 0.7)


def test_json_nested_past_python_s_stack_or_past_the_size_limit_is_refused_in_one_line():
    from laser.vllm.request_args import json_limit

    with pytest.raises(LaserArgsError, match="not valid JSON .nested too deep."):
        LaserArgs.from_extra_args({"laser": "[" * 50_000}, "q3")  # json.loads raised RecursionError
    with pytest.raises(LaserArgsError, match=f"characters, at most {json_limit()}"):
        LaserArgs.from_extra_args({"laser": " " * (json_limit() + 1)}, "q3")
    longest = json.dumps(
        {"v": VERSION, "earlier": [2**63 - 1] * LIMITS.earlier, "pool": "p" * LIMITS.tag, "pool_store": "/" * PATH_MAX}
    )
    assert LaserArgs.from_extra_args({"laser": longest}, "q3").earlier  # every field at its limit still fits
