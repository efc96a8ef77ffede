"""`laser train-align` on a tiny random Llama with a byte-level tokenizer: AtSpeed-S data from the
draft/target mixture, AtSpeed-R data from the target's beams, the loss going down, resume, the saved draft
driving the `atspeed` decoder, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import laser
from jobs.config import load_config
from laser.models import LoadedModel
from pipelines.recommend.config import RecommendJobConfig
from training.align import AlignSettings, align_examples, init_draft, mixture_beams, topk_coverage, train_align
from training.rec_examples import rec_data
from pipelines.knowledge.validation import JobInputError
from tests.helpers import save_tiny_model


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("align") / "target"))


@pytest.fixture()
def job(tmp_path, monkeypatch, tiny_target):
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "cache"))

    def make(*extra: str) -> RecommendJobConfig:
        overrides = [
            "dataset.synthetic.n_users=5",
            "dataset.synthetic.n_items=8",
            "dataset.synthetic.max_history=6",
            "dataset.synthetic.n_clusters=2",
            "split.max_hist=3",
            "split.new_count=2",
            f"model.name={tiny_target}",
            "recommend.K=3",
            "recommend.max_history=2",
            "recommend.item_code_column=item_id",  # short identifiers: i0000 ... i0007
            f"output.path={tmp_path / 'job'}",
            *extra,
        ]
        return load_config(None, overrides, schema=RecommendJobConfig)

    return make


def settings(**kw) -> AlignSettings:
    return AlignSettings(
        **{
            "init": "truncate:1",
            "steps": 4,
            "batch_size": 2,
            "checkpoint_every": 2,
            "eval_every": 2,
            "eval_prompts": 2,
            "top_n": 4,
            "gamma": 2,
            "lr": 3e-3,
            **kw,
        }
    )


def load(path: str):
    return laser.load_model(path, device="cpu", dtype="float32")


def test_strict_data_come_from_the_mixture(job, tiny_target):
    lm = load(tiny_target)
    data = rec_data(job(), lm)
    draft = init_draft(lm, "truncate:1")
    draft_lm = LoadedModel(draft, lm.tokenizer, "draft")
    examples = data.train[:2]

    def beams_of(model_lm, prompt):
        rec = laser.get_decoder("beam", model_lm).recommend(prompt, data.trie, 3)
        return [data.codes[item] + [data.trie.end_token] for item, _ in rec.items]

    at_1 = align_examples(lm, draft, examples, data.trie, data.codes, 3, "strict", lam=1.0)
    relaxed = align_examples(lm, draft, examples, data.trie, data.codes, 3, "relaxed", lam=0.5)
    assert [e.seqs for e in at_1] == [e.seqs for e in relaxed] == [beams_of(lm, e.prompt) for e in examples]
    at_0 = [mixture_beams(draft, lm.model, e.prompt, data.trie, 3, lam=0.0) for e in examples]
    assert at_0 == [beams_of(draft_lm, e.prompt) for e in examples]
    assert at_0 != [e.seqs for e in at_1]  # the draft ranks differently: lam matters
    half = [mixture_beams(draft, lm.model, e.prompt, data.trie, 3, lam=0.5) for e in examples]
    assert all(len(h) == 3 and all(data.trie.item(tuple(s)) for s in h) for h in half)
    assert [e.truth for e in at_1] == [e.target for e in examples]


def test_coverage_is_one_for_the_target_itself(job, tiny_target):
    lm = load(tiny_target)
    data = rec_data(job(), lm)
    prompts = [e.prompt for e in data.train[:2]]
    same = topk_coverage(lm.model, lm.model, prompts, data.trie, 3, 3)
    assert same["coverage"] and all(c == 1.0 for c in same["coverage"] + same["all_in"])
    stranger = laser.tiny_llama(vocab_size=lm.model.config.vocab_size, seed=7).model
    other = topk_coverage(stranger, lm.model, prompts, data.trie, 3, 3)
    assert len(other["coverage"]) == 6 and min(other["coverage"]) < 1.0  # "i000", a digit, the end token


def test_training_on_one_fixed_batch_lowers_the_loss_and_the_draft_serves_atspeed(job, tiny_target):
    cfg = job()
    res = train_align(cfg, settings(name="tiny-aligned", batch_size=10_000, steps=6))
    assert res.steps == 6 and res.losses[-1] < res.losses[0], res.losses
    assert Path(res.path) == laser.models.cached_model_dir("tiny-aligned")
    report = json.loads((Path(res.work_dir) / "report.json").read_text())
    for key in ("before", "after"):
        m = report[key]
        assert set(m["held"]) == {"objective", "align", "rec"}
        assert m["coverage"] and all(0.0 <= c <= 1.0 for c in m["coverage"] + m["all_in"])
        assert m["atspeed_steps_per_forward"] >= 1.0
    assert (Path(res.work_dir) / "loss.png").stat().st_size > 1000
    lm = load(tiny_target)
    trie = rec_data(cfg, lm).trie
    prompt = rec_data(cfg, lm).eval_prompts[0]
    want = laser.get_decoder("beam", lm).recommend(prompt, trie, 3).items
    got = laser.get_decoder("atspeed", lm, draft="tiny-aligned", gamma=2, N=4).recommend(prompt, trie, 3).items
    assert [i for i, _ in got] == [i for i, _ in want]


def test_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(job):
    cfg = job()
    whole = train_align(cfg, settings(mode="relaxed", steps=5, name="whole"))

    def stop_at_3(step: int, loss: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_align(cfg, settings(mode="relaxed", steps=5, name="cut"), on_step=stop_at_3)
    resumed = train_align(cfg, settings(mode="relaxed", steps=5, name="cut"))
    assert resumed.resumed_from == 3 and resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    a, b = load("whole").model.state_dict(), load("cut").model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_bad_input_is_named(job, tiny_target):
    with pytest.raises(JobInputError, match="train-align: K=50 is larger than the number of valid items"):
        train_align(job(), settings(K=50))
    with pytest.raises(JobInputError, match="train-align: no user has two old interactions"):
        train_align(job("split.max_hist=1"), settings())
    with pytest.raises(ValueError, match="mode must be 'strict' or 'relaxed'"):
        AlignSettings(mode="loose")
    with pytest.raises(ValueError, match="lam must lie in"):
        AlignSettings(lam=1.5)
    other = laser.tiny_llama(vocab_size=50)
    other.model.save_pretrained(laser.models.cached_model_dir("small-vocab"))
    load(tiny_target).tokenizer.save_pretrained(laser.models.cached_model_dir("small-vocab"))
    with pytest.raises(ValueError, match="vocabulary of 50"):
        init_draft(load(tiny_target), "small-vocab")
