"""`laser train-recommender` on a tiny random Llama with a byte-level tokenizer: the examples, the loss going
down, LoRA training adapters only and merging them, the saved model by name, resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import laser
from jobs.config import load_config
from pipelines.recommend.config import RecommendJobConfig
from training.rec_examples import rec_data
from training.recommender import RecTrainSettings, prepare, train_recommender
from pipelines.knowledge.validation import JobInputError
from tests.helpers import save_tiny_model


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("rec") / "target"))


@pytest.fixture()
def job(tmp_path, monkeypatch, tiny_target):
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "cache"))  # saved models stay in tmp

    def make(*extra: str) -> RecommendJobConfig:
        overrides = [
            "dataset.synthetic.n_users=6",
            "dataset.synthetic.n_items=10",
            "dataset.synthetic.max_history=8",
            "dataset.synthetic.n_clusters=2",
            "split.max_hist=4",
            "split.new_count=3",
            f"model.name={tiny_target}",
            "recommend.K=3",
            "recommend.max_history=3",
            f"output.path={tmp_path / 'job'}",
            *extra,
        ]
        return load_config(None, overrides, schema=RecommendJobConfig)

    return make


def settings(**kw) -> RecTrainSettings:
    return RecTrainSettings(
        **{"steps": 4, "batch_size": 2, "checkpoint_every": 2, "eval_every": 2, "eval_users": 2, "lr": 3e-3, **kw}
    )


def load(path: str):
    return laser.load_model(path, device="cpu", dtype="float32")


def test_examples_are_next_items_after_the_chat_templated_history(job, tiny_target):
    cfg = job()
    lm = load(tiny_target)
    data = rec_data(cfg, lm)
    assert data.train and data.held and data.eval_prompts
    assert {e.user_id for e in data.train}.isdisjoint({e.user_id for e in data.held})
    ex = data.train[0]
    assert ex.target[-1] == data.trie.end_token == 1 and data.trie.item(tuple(ex.target)) == ex.item_id
    text = lm.tokenizer.decode(ex.prompt)
    assert text.startswith("<s>A user rated these movies") and "Answer with its title only." in text
    assert ex.prompt == laser.get_decoder("beam", lm).encode(text[len("<s>") : text.rindex(".") + 1])


@pytest.mark.parametrize("method", ["lora", "full"])
def test_training_on_one_fixed_batch_lowers_its_loss(job, method):
    cfg = job()
    res = train_recommender(cfg, settings(method=method, batch_size=10_000, steps=6, name=f"fixed-{method}"))
    assert res.steps == 6 and len(res.losses) == 6
    assert res.losses[-1] < 0.9 * res.losses[0], res.losses
    assert res.trainable_params > 0 and res.s_per_step > 0
    if method == "full":
        assert res.trainable_params == res.total_params
    else:
        assert res.trainable_params < res.total_params / 5


def test_lora_trains_adapters_only_and_the_merged_model_differs_from_the_base(job, tiny_target):
    cfg = job()
    wrapped = prepare(load(tiny_target).model, RecTrainSettings(method="lora"))
    names = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    res = train_recommender(cfg, settings(method="lora", name="tiny-lora"))
    assert Path(res.path) == laser.models.cached_model_dir("tiny-lora")
    base, tuned = load(tiny_target), load("tiny-lora")  # by model-cache name
    assert tuned.tokenizer is not None and tuned.eos_ids == base.eos_ids == {1}
    assert not any("lora" in k for k in tuned.model.state_dict())
    assert torch.equal(tuned.model.model.embed_tokens.weight, base.model.model.embed_tokens.weight)
    ids = torch.tensor([[0, 40, 41, 42, 43, 44]])
    with torch.no_grad():
        assert not torch.allclose(tuned.model(ids).logits, base.model(ids).logits, atol=1e-4)
    report = json.loads((Path(res.work_dir) / "report.json").read_text())
    assert set(report["before"]) == set(report["after"]) == {"users", "recall@3", "ndcg@3"}
    assert (Path(res.work_dir) / "loss.png").stat().st_size > 1000
    recs = laser.get_decoder("beam", tuned).recommend_batch([[0, 40, 41, 10]], rec_data(cfg, tuned).trie, 3)
    assert len(recs[0].items) == 3


def test_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(job):
    cfg = job()
    whole = train_recommender(cfg, settings(method="lora", steps=5, name="whole"))

    def stop_at_3(step: int, loss: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_recommender(cfg, settings(method="lora", steps=5, name="cut"), on_step=stop_at_3)
    resumed = train_recommender(cfg, settings(method="lora", steps=5, name="cut"))
    assert resumed.resumed_from == 3 and resumed.steps == 5
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    a, b = load("whole").model.state_dict(), load("cut").model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_bad_input_is_named(job, tiny_target):
    with pytest.raises(JobInputError, match="no user has two old interactions"):
        rec_data(job("split.max_hist=1"), load(tiny_target))
    with pytest.raises(JobInputError, match="recommend.K=50 is larger than the number of valid items"):
        rec_data(job("recommend.K=50"), load(tiny_target))
    with pytest.raises(ValueError, match="method must be 'lora' or 'full'"):
        RecTrainSettings(method="qlora")


def test_cli_reports_bad_input_in_one_line(job, tmp_path, tiny_target):
    from jobs.cli import app

    job()  # sets the cache directory
    cfg = tmp_path / "rec.yaml"
    cfg.write_text(
        "dataset: {format: synthetic, synthetic: {n_users: 4, n_items: 6}}\n"
        f"model: {{name: {json.dumps(tiny_target)}}}\noutput: {{path: {json.dumps(str(tmp_path / 'o'))}}}\n"
    )
    out = CliRunner().invoke(app, ["train-recommender", str(cfg), "--method", "lora", "--set", "recommend.K=99"])
    assert out.exit_code == 2 and "recommend.K=99 is larger" in out.output, out.output
