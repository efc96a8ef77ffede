"""`laser train-draft` on a tiny random Llama: checkpoints, resume after an interrupt or a kill (the resumed
run trains exactly as an uninterrupted one), the saved draft usable by name, the loss plot, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import laser
from jobs.config import load_config
from training.draft import DraftTrainSettings, build_draft, train_draft
from tests.helpers import save_tiny_model


@pytest.fixture()
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "cache"))  # fixtures and saved drafts stay in tmp
    model = save_tiny_model(tmp_path / "target")
    overrides = [
        "dataset.synthetic.n_users=8",
        "dataset.synthetic.n_items=10",
        "dataset.synthetic.max_history=8",
        f"model.name={model}",
        "generation.max_new_tokens=16",
        "generation.max_prompt_tokens=2000",
        f"output.path={tmp_path / 'job'}",
    ]
    return load_config(None, overrides), overrides


def settings(**kw) -> DraftTrainSettings:
    base = dict(
        init="truncate:1",
        steps=6,
        batch_size=2,
        samples=6,
        max_new_tokens=16,
        max_prompt_tokens=32,
        checkpoint_every=2,
        positions=8,
        lr=1e-3,
    )
    return DraftTrainSettings(**{**base, **kw})


def test_interrupted_run_resumes_at_its_checkpoint_and_trains_as_if_never_stopped(job):
    cfg, _ = job
    whole = train_draft(cfg, settings(name="whole"))
    assert whole.steps == 6 and whole.resumed_from == 0 and len(whole.losses) == 6

    def stop_at_3(step: int, loss: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_draft(cfg, settings(name="cut"), on_step=stop_at_3)
    work = Path(cfg.output.path) / "draft-training" / "cut"
    assert torch.load(work / "checkpoint.pt", weights_only=False)["step"] == 3
    resumed = train_draft(cfg, settings(name="cut"))
    assert resumed.resumed_from == 3 and resumed.steps == 6
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    assert (work / "loss.png").stat().st_size > 1000 and (work / "report.json").exists()


KILL = """
import os, signal, sys
from jobs.config import load_config
from training.draft import DraftTrainSettings, train_draft
s = DraftTrainSettings(name="killed", init="truncate:1", steps=6, batch_size=2, samples=6, max_new_tokens=16,
                       max_prompt_tokens=32, checkpoint_every=2, positions=8, lr=1e-3)
kill = lambda step, loss: os.kill(os.getpid(), signal.SIGKILL) if step == 5 else None
train_draft(load_config(None, sys.argv[1:]), s, on_step=kill)
"""


@pytest.mark.slow
def test_killed_run_resumes_from_the_last_periodic_checkpoint(job):
    cfg, overrides = job
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", KILL, *overrides], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = train_draft(cfg, settings(name="killed"))
    assert resumed.resumed_from == 4 and resumed.steps == 6 and len(resumed.losses) == 6


def test_saved_draft_is_a_draft_by_name_and_stays_lossless(job):
    cfg, _ = job
    res = train_draft(cfg, settings(name="tiny-draft", steps=2))
    assert Path(res.path) == laser.models.cached_model_dir("tiny-draft") and 0.0 <= res.agreement_after <= 1.0
    lm = laser.load_model(cfg.model.name, device="cpu", dtype="float32")
    dec = laser.get_decoder("spec_sampling", lm, draft="tiny-draft", gamma=3)
    prompt = [2, 40, 41, 42, 43]
    want = lm.model.generate(
        torch.tensor([prompt]),
        max_new_tokens=12,
        do_sample=False,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )[0, len(prompt) :].tolist()
    got = dec.generate(prompt, 12).token_ids
    assert got == want


def test_fresh_draft_has_the_targets_vocabulary_and_bad_settings_are_named(job):
    target = laser.tiny_llama(vocab_size=96, hidden_size=64)
    draft = build_draft(target.model, "fresh:1:32")
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == 32
    assert draft(torch.tensor([[3, 4]])).logits.shape[-1] == 96
    with pytest.raises(ValueError, match="init 'layers:2': expected truncate:N"):
        DraftTrainSettings(init="layers:2")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        DraftTrainSettings(steps=0)
    with pytest.raises(ValueError, match="multiple of the head size 16"):
        build_draft(target.model, "fresh:1:40")
