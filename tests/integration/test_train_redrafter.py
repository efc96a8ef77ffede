"""ReDrafter head training: features, loss, resume after a kill, files, and the head in the decoder
(tiny random Llama; no download)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import laser
from training.redrafter import TrainSettings, extract_features, fit_and_save, shortlist_tokens, train_head
from tests.helpers import greedy_reference, random_prompts

SETTINGS = dict(kind="shortlist", shortlist=64, depth=3, steps=8, batch_positions=64, checkpoint_every=2, lr=3e-3)


def _sequences(lm, n=12):
    prompts = random_prompts(n, lm.model.config.vocab_size, seed=21)
    return [(p, greedy_reference(lm, p, 24)) for p in prompts]


@pytest.fixture(scope="module")
def data(tiny_lm):
    seqs = _sequences(tiny_lm)
    shortlist, coverage = shortlist_tokens([a for _, a in seqs], 64, sorted(tiny_lm.eos_ids))
    return seqs, extract_features(tiny_lm, seqs, 3), shortlist, coverage


def test_features_are_the_next_tokens(tiny_lm, data):
    seqs, feats, _, _ = data
    prompt, answer = seqs[0]
    assert feats.tokens[0].tolist() == answer[:4]
    assert feats.tokens[len(answer) - 1].tolist() == [answer[-1], -100, -100, -100]
    want = tiny_lm.model(torch.tensor([prompt + answer]), output_hidden_states=True).hidden_states[-1][
        0, len(prompt) - 1
    ]
    torch.testing.assert_close(feats.hidden[0], want)
    assert len(feats.hidden) == sum(len(a) for _, a in seqs)


def test_shortlist_keeps_eos_and_the_most_frequent(data, tiny_lm):
    _, _, shortlist, coverage = data
    assert set(tiny_lm.eos_ids) <= set(shortlist.tolist()) and len(shortlist) <= 64
    assert 0.5 < coverage <= 1.0


def test_training_lowers_the_loss(tiny_lm, data, tmp_path):
    _, feats, shortlist, _ = data
    _, history = train_head(tiny_lm, feats, TrainSettings(**{**SETTINGS, "steps": 30}), tmp_path, shortlist, False)
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    assert all(p.grad is None or not p.requires_grad for p in tiny_lm.model.parameters()), "the target stays frozen"


_KILLED_RUN = textwrap.dedent("""
    import os, sys, torch
    import laser
    import training.redrafter as tr
    from tests.helpers import greedy_reference, random_prompts
    from tests.integration.test_train_redrafter import SETTINGS, _sequences
    torch.set_num_threads(1)
    lm = laser.tiny_llama(seed=3)
    seqs = _sequences(lm)
    shortlist, _ = tr.shortlist_tokens([a for _, a in seqs], 64, sorted(lm.eos_ids))
    feats = tr.extract_features(lm, seqs, 3)
    real_save = tr.save_checkpoint
    def save_then_die(path, head, opt, sched, settings, step, history):
        real_save(path, head, opt, sched, settings, step, history)
        if step == 4:
            os._exit(9)  # killed right after the second checkpoint: no clean-up runs
    tr.save_checkpoint = save_then_die
    tr.train_head(lm, feats, tr.TrainSettings(**SETTINGS), __import__("pathlib").Path(sys.argv[1]), shortlist, False)
""")


def test_resume_after_a_kill_equals_an_uninterrupted_run(tiny_lm, data, tmp_path):
    _, feats, shortlist, _ = data
    killed = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(killed)],
        capture_output=True,
        text=True,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert torch.load(killed / "checkpoint.pt", weights_only=False)["step"] == 4
    resumed, hist_resumed = train_head(tiny_lm, feats, TrainSettings(**SETTINGS), killed, shortlist, False)
    whole, hist_whole = train_head(tiny_lm, feats, TrainSettings(**SETTINGS), tmp_path / "whole", shortlist, False)
    assert [h["step"] for h in hist_resumed] == list(range(1, 9))
    for a, b in zip(hist_resumed, hist_whole):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for (name, a), (_, b) in zip(resumed.state_dict().items(), whole.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


def test_resume_with_other_settings_is_refused(tiny_lm, data, tmp_path):
    _, feats, shortlist, _ = data
    train_head(tiny_lm, feats, TrainSettings(**{**SETTINGS, "steps": 2}), tmp_path, shortlist, False)
    with pytest.raises(ValueError, match="other training settings.*steps"):
        train_head(tiny_lm, feats, TrainSettings(**{**SETTINGS, "steps": 3}), tmp_path, shortlist, False)


@pytest.mark.slow
def test_fit_and_save_writes_a_head_the_decoder_loads_by_name(tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "cache"))
    seqs = _sequences(tiny_lm)
    summary = fit_and_save(
        tiny_lm, seqs, TrainSettings(**{**SETTINGS, "steps": 20}), "tiny-head", tmp_path / "work", progress=False
    )
    head_file = tmp_path / "cache" / "heads" / "tiny-head.pt"
    assert summary["path"] == str(head_file) and head_file.exists()
    assert head_file.with_suffix(".png").stat().st_size > 1000
    assert len(json.loads(head_file.with_suffix(".json").read_text())["history"]) == 20
    dec = laser.get_decoder("redrafter", tiny_lm, head="tiny-head", beam_width=2, beam_length=4)
    prompt = seqs[0][0]
    assert dec.generate(prompt, 16).token_ids == greedy_reference(tiny_lm, prompt, 16)
    with pytest.raises(ValueError, match="trained for 'tiny-llama-3'"):
        laser.get_decoder("redrafter", laser.tiny_llama(seed=9), head="tiny-head")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="kind"):
        TrainSettings(kind="huge")
    with pytest.raises(ValueError, match=">= 1"):
        TrainSettings(depth=0)


def test_generated_examples_carry_the_forward_hidden_states_and_resume(tiny_lm, tmp_path):
    from training.redrafter import examples_features, generate_examples

    prompts = random_prompts(3, 96, seed=30)
    examples = generate_examples(tiny_lm, prompts, 12, tmp_path, batch=2, progress=False)
    for (prompt, answer, hidden), p in zip(examples, prompts):
        assert prompt == p and answer == greedy_reference(tiny_lm, p, 12)[: len(answer)]
        full = tiny_lm.model(torch.tensor([p + answer]), output_hidden_states=True).hidden_states[-1][0]
        want = full[len(p) - 1 : len(p) - 1 + len(hidden)]  # hidden[i] predicts answer[i]
        torch.testing.assert_close(hidden.float(), want, atol=2e-2, rtol=2e-2)  # stored in fp16
    feats = examples_features(tiny_lm, examples, 3, "x")
    assert feats.tokens[0].tolist() == examples[0][1][:4]
    # a second call finds them on disk and generates only what is missing
    more = generate_examples(tiny_lm, prompts + [[5, 6, 7]], 12, tmp_path, batch=2, progress=False)
    assert [e[1] for e in more[:3]] == [e[1] for e in examples] and len(more) == 4
