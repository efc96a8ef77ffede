"""Decoder registry, plug-ins and bad-input errors."""

from __future__ import annotations

import pytest

import laser
from laser.decoders import registry


def test_unknown_decoder_lists_known(tiny_lm):
    with pytest.raises(ValueError, match="known decoders: .*autoregressive, .*laser, .*resd"):
        laser.get_decoder("nope", tiny_lm)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"k": 0}, "k must be"),
        ({"p": 1.0}, "p must lie"),
        ({"p": -0.2}, "p must lie"),
        ({"verification": "fuzzy"}, "verification"),
        ({"K": -1}, "K must be"),
        ({"bogus": 1}, "bad parameters"),
        ({"min_prob": 1.0}, "min_prob"),
    ],
)
def test_bad_decoder_params(tiny_lm, params, message):
    with pytest.raises(ValueError, match=message):
        laser.get_decoder("laser", tiny_lm, **params)


def test_bad_requests(tiny_lm):
    decoder = laser.get_decoder("laser", tiny_lm)
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.generate([], 4)
    with pytest.raises(ValueError, match="no tokenizer"):
        decoder.generate("hello", 4)
    with pytest.raises(ValueError, match="does not fit the model's context of 512"):
        decoder.generate([3] * 512, 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([3, 4], 0)


def test_exact_requests_and_which_decoder_runs_whose_greedy_rows(tiny_lm):
    relaxed = laser.get_decoder("laser", tiny_lm, K=4)
    assert relaxed.runs_greedy_of(laser.get_decoder("laser", tiny_lm, verification="greedy", K=4))
    assert not relaxed.runs_greedy_of(laser.get_decoder("laser", tiny_lm, verification="greedy", K=8))  # other drafts
    assert not relaxed.runs_greedy_of(laser.get_decoder("resd", tiny_lm))
    assert relaxed.request([3, 4], 4, exact=True).exact
    with pytest.raises(ValueError, match="exact request needs greedy sampling"):
        relaxed.request([3, 4], 4, sampling=laser.SamplingParams(temperature=1.0), exact=True)
    with pytest.raises(ValueError, match="exact request needs greedy sampling and a top-k or rejection verifier"):
        laser.get_decoder("atspeed", tiny_lm).request([3, 4], 4, exact=True)


def test_entry_point_plugins_are_registered(tiny_lm, monkeypatch):
    class Echo(laser.Decoder):
        name = "echo"
        summary = "test plug-in"

    class FakeEntryPoint:
        name, value = "echo", "tests:Echo"

        def load(self):
            return Echo

    monkeypatch.setattr(registry, "entry_points", lambda group: [FakeEntryPoint()] if group == "laser.decoders" else [])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "echo" in laser.available_decoders()
    assert isinstance(laser.get_decoder("echo", tiny_lm), Echo)


def test_params_are_recorded(tiny_lm):
    d = laser.get_decoder("laser", tiny_lm, k=3, p=0.2, K=16)
    assert d.params() == {"verification": "relaxed", "k": 3, "p": 0.2, "K": 16, "n_max": 8, "min_prob": 0.0}


def test_draft_budget_is_adaptive_unless_fixed(tiny_lm):
    from laser.budget import AdaptiveBudget

    d = laser.get_decoder("resd", tiny_lm)
    assert d.params()["K"] == "auto" and isinstance(d.engine.budget, AdaptiveBudget)
    assert laser.get_decoder("resd", tiny_lm, K="auto").engine.budget is not None
    assert laser.get_decoder("resd", tiny_lm, K=8).engine.budget is None  # fixed: each step drafts up to 8
    assert laser.get_decoder("autoregressive", tiny_lm).engine.budget is None  # nothing to draft
    with pytest.raises(ValueError, match="K must be 'auto' or an integer"):
        laser.get_decoder("resd", tiny_lm, K="many")


def test_cli_lists_decoders():
    from typer.testing import CliRunner

    from jobs.cli import app

    result = CliRunner().invoke(app, ["decoders"])
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.strip().splitlines()]
    assert names == sorted(names) and {
        "autoregressive",
        "laser",
        "resd",
        "spec_sampling",
        "topk_imp",
        "beam",
        "atspeed",
        "beam_sample",
        "dsbd",
        "redrafter",
    } <= set(names)
