"""A request's LASER arguments (laser.vllm.request_args): one typed record written by the engine and read by
the proposer in vLLM's process; a bad argument fails where it is written, or with the request's id where
it is read. No vLLM needed."""

from __future__ import annotations

import json
import pickle

import pytest

from laser.defaults import N_MAX
from laser.vllm.request_args import VERSION, LaserArgs, LaserArgsError, request_args


def test_round_trip_through_extra_args_and_the_wire():
    args = LaserArgs(
        tag="r7",
        pool="user/collab/3",
        pool_store="/data/pools",
        k=2,
        p=0.1,
        draft_len=3,
        earlier=(5, 6, 7),
        n_max=4,
        min_prob=0.05,
    )
    extra = args.to_extra_args()
    assert extra["laser"]["v"] == VERSION and extra["laser"]["earlier"] == [5, 6, 7]  # a list on the wire
    assert LaserArgs.from_extra_args(extra, "r7") == args
    wire = pickle.loads(pickle.dumps(extra))  # what crosses the boundary is plain values
    assert LaserArgs.from_extra_args(wire, "r7") == args
    assert args.rule == (2, 0.1) and args.fixed_len == 3


def test_a_request_without_laser_arguments_gets_the_defaults():
    for extra in (None, {}, {"other": 1}):
        got = LaserArgs.from_extra_args(extra, "x")
        assert got == LaserArgs() and got.rule is None and got.fixed_len is None and got.n_max == N_MAX


def test_another_version_is_refused_with_the_request_id():
    extra = LaserArgs(tag="a").to_extra_args()
    extra["laser"]["v"] = VERSION + 1
    with pytest.raises(LaserArgsError, match=rf"request r9: LASER arguments of version {VERSION + 1}"):
        LaserArgs.from_extra_args(extra, "r9")
    del extra["laser"]["v"]
    with pytest.raises(LaserArgsError, match="request r9: LASER arguments of version None"):
        LaserArgs.from_extra_args(extra, "r9")


def test_a_renamed_key_fails_where_it_is_written():
    with pytest.raises(TypeError, match="pool_key"):
        LaserArgs(pool_key="user/collab/3")  # type: ignore[call-arg]
    extra = LaserArgs(pool="g").to_extra_args()
    extra["laser"]["pool_key"] = extra["laser"].pop("pool")  # a writer that renamed a key
    with pytest.raises(LaserArgsError, match=r"request r3: unknown LASER argument\(s\) 'pool_key'; known"):
        LaserArgs.from_extra_args(extra, "r3")


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"draft_len": -1}, r"draft_len must be 'auto' or an integer in \[0, 64\]"),
        ({"draft_len": 2**70}, "draft_len must be 'auto' or an integer in .*, got an integer of 71 bits"),
        ({"k": 2**70, "p": 0.1}, "k must be an integer >= 1"),
        ({"n_max": 5000}, r"n_max must be an integer in \[1, 32\]"),
        ({"earlier": tuple(range(5000))}, "earlier must be at most 4096 tokens"),
        ({"earlier": (1, -2)}, "earlier must be token ids"),
        ({"tag": "t" * 300}, "tag must be a string of at most 256"),
        ({"pool": 2**80}, "pool must be a string of at most 256 characters or an integer within int64"),
        ({"draft_len": "long"}, "draft_len must be 'auto'"),
        ({"draft_len": True}, "draft_len must be 'auto'"),
        ({"k": 2}, "k and p go together"),
        ({"k": 0, "p": 0.1}, "k must be an integer >= 1"),
        ({"k": 2, "p": 1.5}, "p must be a probability"),
        ({"pool_store": "/s"}, "pool_store must be a directory"),
        ({"pool": ["a", 1]}, "pool must be a string"),
        ({"earlier": (1, "x")}, "earlier must be token ids"),
        ({"n_max": 0}, "n_max must be an integer in"),
        ({"min_prob": float("nan")}, "min_prob must be a probability"),
        ({"draft": "no"}, "draft must be true or false"),
        ({"tag": 3}, "tag must be a string"),
    ],
)
def test_a_malformed_value_is_refused_in_one_line(kwargs, problem):
    with pytest.raises(LaserArgsError, match=problem) as err:
        LaserArgs(**kwargs)
    assert "\n" not in str(err.value)
    raw = {"laser": {"v": VERSION, **kwargs}}
    if isinstance(kwargs.get("earlier"), tuple):
        raw["laser"]["earlier"] = list(kwargs["earlier"])
    with pytest.raises(LaserArgsError, match=f"request q1: {problem}"):
        LaserArgs.from_extra_args(raw, "q1")


def test_earlier_is_a_tuple_in_the_record_and_a_list_only_on_the_wire():
    with pytest.raises(LaserArgsError, match="earlier must be token ids"):
        LaserArgs(earlier=[1, 2])  # type: ignore[arg-type]
    assert LaserArgs.from_extra_args({"laser": {"v": VERSION, "earlier": [1, 2]}}, "e").earlier == (1, 2)


def test_request_args_is_one_flat_json_value_that_reads_back_as_the_record():
    """A team's own vLLM: request_args gives extra_args whose only value is JSON text (the OpenAI server's
    vllm_xargs takes flat values only), and the proposer reads it back as the same record."""
    extra = request_args(pool="user/collaborative/3", pool_store="/data/pools", k=2, p=0.1, earlier=[5, 6])
    assert set(extra) == {"laser"} and isinstance(extra["laser"], str)
    assert json.loads(extra["laser"])["v"] == VERSION
    assert LaserArgs.from_extra_args(extra, "r1") == LaserArgs(
        pool="user/collaborative/3", pool_store="/data/pools", k=2, p=0.1, earlier=(5, 6)
    )
    with pytest.raises(LaserArgsError, match="k and p go together"):
        request_args(pool="a", k=2)  # fails in the caller, not inside vLLM
    with pytest.raises(LaserArgsError, match="request r2: .*not valid JSON"):
        LaserArgs.from_extra_args({"laser": "{pool: 1"}, "r2")
    with pytest.raises(LaserArgsError, match="request r3: unknown LASER argument"):
        LaserArgs.from_extra_args({"laser": json.dumps({"v": VERSION, "pool_id": "a"})}, "r3")


def test_speculative_config_makes_laser_the_drafter():
    from laser.vllm import speculative_config
    from laser.vllm.env import PROPOSER_CLASS

    assert speculative_config(4) == {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": 4}
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            speculative_config(bad)
