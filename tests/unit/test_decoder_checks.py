"""The job's decoder checks: remembered when they pass, so a scheduled run's driver starts its workers
without loading transformers (pipelines/knowledge/decoder_checks.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from laser.decoders import registry
from laser.decoder_card import DecoderCard, DecoderChoice
from pipelines.knowledge import decoder_checks
from pipelines.knowledge.decoders import decoder_card, resolve_job_decoder
from pipelines.knowledge.validation import JobInputError

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path))
    return tmp_path / "decoder-checks.json"


def _refuse(*args, **kwargs):
    raise AssertionError("the decoder was checked again")


def test_a_passed_check_is_read_back_without_checking_again(cache, monkeypatch):
    first = resolve_job_decoder("laser", {"k": 3}, model="smollm2-135m", sampling=SAMPLING)
    assert first.params["k"] == 3 and first.card.pool == "routed" and "vllm" in first.card.engines
    assert cache.is_file()
    monkeypatch.setattr(registry, "resolve_decoder", _refuse)
    again = resolve_job_decoder("laser", {"k": 3}, model="smollm2-135m", sampling=SAMPLING)
    assert again == first and again.card == DecoderCard.of(registry.available_decoders()["laser"])
    with pytest.raises(AssertionError, match="checked again"):  # other parameters: a check of their own
        resolve_job_decoder("laser", {"k": 4}, model="smollm2-135m", sampling=SAMPLING)


def test_a_failed_check_is_never_remembered(cache):
    for _ in range(2):
        with pytest.raises(JobInputError, match=r"decoder\.params"):
            resolve_job_decoder("laser", {"k": 0}, model="smollm2-135m")
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    assert not saved.get("verdicts")


def test_other_code_checks_again(cache, monkeypatch):
    resolve_job_decoder("resd", {}, model="smollm2-135m")
    monkeypatch.setattr(registry, "resolve_decoder", _refuse)
    monkeypatch.setattr(decoder_checks, "code_stamp", lambda: "another version of the package")
    with pytest.raises(AssertionError, match="checked again"):
        resolve_job_decoder("resd", {}, model="smollm2-135m")


def test_cards_match_the_registered_classes_and_read_back(cache):
    known = registry.available_decoders()
    cards = decoder_checks.cards()
    assert set(cards) == set(known)
    for name, cls in known.items():
        assert cards[name] == DecoderCard.of(cls)
        assert decoder_card(name) == DecoderCard.from_json(json.loads(json.dumps(cards[name].as_json())))
    assert decoder_checks.cards() == cards  # now from the file


def test_a_decoder_registered_at_run_time_is_not_remembered(cache, monkeypatch):
    class Local(registry.available_decoders()["autoregressive"]):  # type: ignore[misc, valid-type]
        name = "local_test_decoder"

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY) | {Local.name: Local})
    choice = resolve_job_decoder(Local.name, {})
    assert choice.card.home.startswith(__name__)
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    assert not any(Local.name in key for key in saved.get("verdicts", {}))
    assert Local.name not in saved.get("cards", {})


def test_the_job_module_imports_neither_transformers_nor_scikit_learn():
    """What a scheduled run's driver imports before it starts its workers (torch, not the rest)."""
    code = (
        "import sys, pipelines.knowledge.job, pipelines.knowledge.decoders, jobs.scheduled; "
        "print(sorted(m for m in ('transformers', 'sklearn', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parameters_that_would_not_read_back_as_they_are_are_not_remembered(cache):
    card = DecoderCard.of(registry.available_decoders()["laser"])
    decoder_checks.remember(DecoderChoice(card, {"K": (4, 8)}), "laser", {}, None, "text", None)
    assert decoder_checks.recall("laser", {}, None, "text", None) is None
    decoder_checks.remember(DecoderChoice(card, {"K": 8}), "laser", {}, None, "text", None)
    assert decoder_checks.recall("laser", {}, None, "text", None) == DecoderChoice(card, {"K": 8})


def test_a_decoder_that_loads_artefacts_is_checked_every_time(cache, monkeypatch):
    """A draft model or a head can change under the same code: its check is not remembered."""
    params = {"draft": "truncate:1", "gamma": 2}
    assert resolve_job_decoder("spec_sampling", params).card.requires == ("draft_model",)
    monkeypatch.setattr(registry, "resolve_decoder", _refuse)
    with pytest.raises(AssertionError, match="checked again"):
        resolve_job_decoder("spec_sampling", params)


@pytest.mark.parametrize(
    "first", ["laser.decoder_card", "laser.decoders.dsbd.decoders", "laser.decoders.draft_model.decoders"]
)
def test_any_decoder_module_imports_first(first):
    """A fresh process that imports one decoder module first still registers every built-in decoder."""
    code = f"import {first}; from laser.decoders import available_decoders; print(len(available_decoders()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-500:]
    assert int(out.stdout) == len(registry.available_decoders())
