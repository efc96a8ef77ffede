"""`laser recommend`: identifiers, store, metrics, resume and the job end to end (tiny model, synthetic data)."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.config import load_config
from pipelines.workers import LocalGroup, ModelSpec
from pipelines.recommend import job as recjob
from pipelines.recommend.config import RecommendJobConfig
from pipelines.recommend.items import item_identifiers
from pipelines.recommend.metrics import user_metrics
from pipelines.recommend.store import read_recommendations
from pipelines.recommend.worker import RecommendWorker
from pipelines.knowledge.validation import JobInputError


def write_config(tmp_path, model: str, extra: str = "") -> str:
    path = tmp_path / "rec.yaml"
    path.write_text(f"""
dataset: {{format: synthetic, seed: 1, synthetic: {{n_users: 6, n_items: 10, n_clusters: 2, max_history: 8}}}}
split: {{max_hist: 4, new_count: 3}}
model: {{name: {json.dumps(model)}, dtype: float32}}
recommend: {{K: 3, max_history: 3}}
execution: {{num_workers: 1, batch_size: 2}}
output: {{path: {json.dumps(str(tmp_path / "out"))}, shard_rows: 4}}
{extra}
""")
    return str(path)


class InProcessGroup(LocalGroup):
    """The driver's interface in this process (no Ray), one result per batch; can crash after some."""

    def __init__(self, model: str, fail_after: int | None = None):
        super().__init__(RecommendWorker(ModelSpec(model=model, dtype="float32")))
        self.fail_after = fail_after

    def stream(self, requests, task, *, slots, desc="", unit="user"):
        for n, i in enumerate(range(0, len(requests), slots)):
            if self.fail_after is not None and n == self.fail_after:
                raise KeyboardInterrupt("crash")
            yield self.worker.generate(task, requests[i : i + slots], slots)


def test_metrics_hand_computed():
    assert user_metrics(["a", "b", "c"], {"b", "z"}, 3) == pytest.approx(
        (0.5, (1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    )
    assert user_metrics(["a", "b"], {"a"}, 1) == (1.0, 1.0)
    assert user_metrics(["x"], {"a"}, 1) == (0.0, 0.0)


def test_identifiers_bad_input():
    items = pl.DataFrame({"item_id": ["1", "2", "3"], "title": ["A", "A", "B"], "year": [1990, 1990, 1991]})
    with pytest.raises(
        JobInputError, match=r"'A \(1990\)' for items \['1', '2'\].*told apart by their year.*item_code_column"
    ):
        item_identifiers(items)
    assert item_identifiers(items.with_columns(code=pl.Series(["x", "y", "z"])), "code") == {
        "1": "x",
        "2": "y",
        "3": "z",
    }
    with pytest.raises(JobInputError, match="item '2': empty 'title'"):
        item_identifiers(pl.DataFrame({"item_id": ["1", "2"], "title": ["A", None]}))
    with pytest.raises(JobInputError, match="no column 'code'"):
        item_identifiers(items, "code")


def test_job_writes_ranked_items_resumes_and_evaluates(tiny_model, tmp_path):
    cfg = load_config(write_config(tmp_path, tiny_model), schema=RecommendJobConfig)
    assert cfg.decoder.name == "beam"
    with pytest.raises(KeyboardInterrupt):  # crash after the first batch: its users are kept
        recjob.run_recommend_job(cfg, InProcessGroup(tiny_model, fail_after=1))
    first = read_recommendations(recjob.store_path(cfg))
    assert first["user_id"].n_unique() == 2 and first.height == 6
    summary = recjob.run_recommend_job(cfg, InProcessGroup(tiny_model))
    recs = read_recommendations(recjob.store_path(cfg))
    data = recjob.load_job_data(cfg)
    users = set(data.split.new_interactions["user_id"])
    assert set(recs["user_id"]) | _failed(cfg) == users  # every user with a new history, once
    assert recs.group_by("user_id").len()["len"].to_list() == [3] * recs["user_id"].n_unique()
    assert (
        recs.filter(pl.col("user_id").is_in(first["user_id"].to_list()))["generated_at"].to_list()
        == first["generated_at"].to_list()
    )
    for _, g in recs.group_by("user_id"):
        assert g["rank"].to_list() == [1, 2, 3] and g["score"].is_sorted(descending=True)
    assert set(recs["item_id"]) <= set(data.dataset.items["item_id"])
    assert recs["decoder"].unique().to_list() == ["beam"]
    assert 0 <= summary.metrics["recall@3"] <= 1 and summary.metrics["users"] == recs["user_id"].n_unique()
    assert json.loads((recjob.store_path(cfg).parent / "recommend_eval.json").read_text())["K"] == 3


def _failed(cfg) -> set[str]:
    path = recjob.store_path(cfg) / "failures.jsonl"
    return {json.loads(line)["entity_id"] for line in path.read_text().splitlines()} if path.exists() else set()


def test_cli_refuses_K_above_catalogue(tiny_model, tmp_path):
    result = CliRunner().invoke(app, ["recommend", write_config(tmp_path, tiny_model), "--set", "recommend.K=50"])
    assert result.exit_code == 2 and "recommend.K=50 is larger than the number of valid items (10" in result.output
    result = CliRunner().invoke(app, ["recommend", write_config(tmp_path, tiny_model), "--set", "recommend.kk=5"])
    assert result.exit_code == 2 and "recommend.kk" in result.output


@pytest.mark.slow
def test_cli_runs_on_ray(tiny_model, tmp_path):
    result = CliRunner().invoke(app, ["recommend", write_config(tmp_path, tiny_model)])
    assert result.exit_code == 0, result.output
    assert "recall@3" in result.output
    assert read_recommendations(tmp_path / "out" / "recommendations").height % 3 == 0


def test_atspeed_strict_job_writes_beams_rows(tiny_model, tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    beam_cfg = load_config(write_config(tmp_path / "b", tiny_model), schema=RecommendJobConfig)
    fast_cfg = load_config(
        write_config(tmp_path / "a", tiny_model),
        ["decoder.name=atspeed", "decoder.params={draft: 'truncate:1', gamma: 3, N: 6}"],
        schema=RecommendJobConfig,
    )
    group = InProcessGroup(tiny_model)
    recjob.run_recommend_job(beam_cfg, group)
    recjob.run_recommend_job(fast_cfg, group)
    cols = ["user_id", "rank", "item_id"]
    a, b = read_recommendations(recjob.store_path(fast_cfg)), read_recommendations(recjob.store_path(beam_cfg))
    assert a.select(cols).equals(b.select(cols)) and a.height
    assert (a["score"] - b["score"]).abs().max() < 1e-4
    assert a["target_forwards"].sum() < b["target_forwards"].sum()


def test_decoder_check_accepts_deep_truncated_drafts():
    from pipelines.knowledge.decoders import resolve_job_decoder

    resolve_job_decoder("atspeed", {"draft": "truncate:8", "gamma": 3}, produces="ranking")
    with pytest.raises(JobInputError, match="N=2 draft|gamma and N"):
        resolve_job_decoder("atspeed", {"draft": "truncate:8", "gamma": 0}, produces="ranking")


@pytest.mark.parametrize("decoder,params", [("beam_sample", {"W": 2}), ("dsbd", {"gamma": 2, "W": 2, "W_S": 3})])
def test_beam_sampling_decoders_write_knowledge(tiny_model, decoder, params):
    from pipelines.knowledge.generation import GenerationWorker
    from pipelines.knowledge.records import DecodeTask
    from pipelines.workers import GenerationRequest

    worker = GenerationWorker(ModelSpec(model=tiny_model, dtype="float32"))
    task = DecodeTask(decoder=decoder, decoder_params=params, max_new_tokens=6, domain="movie", run_id="r")
    reqs = [GenerationRequest("item", f"i{k}", item={"item_id": f"i{k}", "title": f"Film {k}"}) for k in range(2)]
    out = worker.generate(task, reqs)
    assert not out.failures and len(out.rows) == 2
    assert all(r.decoder == decoder and 1 <= r.n_tokens <= 6 for r in out.rows)
