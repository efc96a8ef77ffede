"""Sampling in the job: config keys, per-entity seeds (same text whatever the batch), the `sampling`
column, old stores without it, and decoder/draft checks before any work."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.config import ConfigError, load_config
from pipelines.knowledge.generation import GenerationWorker
from pipelines.knowledge.records import DecodeTask
from pipelines.workers import GenerationRequest, ModelSpec
from pipelines.store.knowledge import KNOWLEDGE_SCHEMA, KnowledgeWriter, read_knowledge
from pipelines.knowledge.sampling import entity_sampling, entity_seed
from pipelines.knowledge.decoders import check_job_decoders as check_job_decoder
from pipelines.knowledge.decoders import resolve_job_decoder as check_decoder
from pipelines.knowledge.validation import JobInputError
from tests.helpers import save_tiny_model

HOT = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 5}


@pytest.fixture(scope="module")
def worker(tiny_model) -> GenerationWorker:
    return GenerationWorker(ModelSpec(tiny_model, dtype="float32"))


def _user(uid: str) -> GenerationRequest:
    return GenerationRequest("user", uid, history=[(f"Film {uid}", 4.0), ("Heat", 3.0)])


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("temperature", -0.5, "greater than or equal to 0"),
        ("top_p", 0, "greater than 0"),
        ("top_p", 1.5, "less than or equal to 1"),
        ("top_k", -1, "greater than or equal to 0"),
    ],
)
def test_bad_sampling_values_are_named(key, value, words):
    with pytest.raises(ConfigError, match=rf"generation\.{key}: .*{words}"):
        load_config(None, [f"generation.{key}={value}"])


def test_greedy_is_the_default_and_settings_reach_the_task():
    cfg = load_config(None, ["generation.temperature=0.7", "generation.top_k=20", "generation.seed=3"])
    assert load_config(None).generation.sampling()["temperature"] == 0.0
    assert cfg.generation.sampling() == {"temperature": 0.7, "top_p": 1.0, "top_k": 20, "seed": 3}


def test_entity_seeds_are_stable_and_distinct():
    assert entity_seed(0, "user", "7") == entity_seed(0, "user", "7")
    seeds = {
        entity_seed(0, "user", "7"),
        entity_seed(1, "user", "7"),
        entity_seed(0, "item", "7"),
        entity_seed(0, "user", "8"),
    }
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert entity_sampling(None, "user", "7").greedy and entity_sampling({**HOT, "temperature": 0}, "user", "7").greedy


@pytest.mark.parametrize(
    "decoder,params", [("autoregressive", {}), ("spec_sampling", {"draft": "truncate:1", "gamma": 3})]
)
def test_an_entity_writes_the_same_text_whatever_its_batch(worker, decoder, params):
    task = DecodeTask(decoder, params, max_new_tokens=24, max_prompt_tokens=2000, sampling=HOT)
    alone = worker.generate(task, [_user("u1")]).rows[0]
    mixed = {r.entity_id: r for r in worker.generate(task, [_user("u3"), _user("u1"), _user("u4")]).rows}
    assert mixed["u1"].knowledge == alone.knowledge and alone.n_tokens > 8
    other_seed = DecodeTask(decoder, params, max_new_tokens=24, max_prompt_tokens=2000, sampling={**HOT, "seed": 6})
    assert worker.generate(other_seed, [_user("u1")]).rows[0].knowledge != alone.knowledge  # it samples
    recorded = json.loads(alone.sampling)
    assert recorded == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": entity_seed(5, "user", "u1")}


def test_rows_record_greedy_sampling_by_default(worker):
    row = worker.generate(DecodeTask("autoregressive", max_new_tokens=4, max_prompt_tokens=2000), [_user("u1")]).rows[0]
    assert json.loads(row.sampling)["temperature"] == 0.0


def test_old_stores_without_the_sampling_column_stay_readable(worker, tmp_path):
    row = worker.generate(DecodeTask("autoregressive", max_new_tokens=4, max_prompt_tokens=2000), [_user("u1")]).rows[0]
    with KnowledgeWriter(tmp_path / "k", shard_rows=1) as writer:
        writer.add(row)
    shard = next((tmp_path / "k").glob("part-*.parquet"))
    old = pq.read_table(shard).drop(["sampling"])  # a shard written before the column existed
    assert "sampling" not in old.schema.names and "sampling" in KNOWLEDGE_SCHEMA.names
    pq.write_table(old, shard)
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    for s in manifest["shards"]:
        s.pop("sha256", None)  # the shard was rewritten on purpose
    (tmp_path / "k" / "manifest.json").write_text(json.dumps(manifest))
    frame = read_knowledge(tmp_path / "k")
    assert frame.height == 1 and frame["sampling"].to_list() == [None]
    assert isinstance(frame.to_arrow().schema.field("sampling").type, type(pa.string()))


def test_relaxed_laser_at_temperature_above_0_is_a_config_error_before_work():
    cfg = load_config(None, ["decoder.name=laser", "decoder.params.verification=relaxed", "generation.temperature=1"])
    with pytest.raises(JobInputError, match=r"generation\.temperature=1.0: decoder 'laser' refuses it: relaxed"):
        check_job_decoder(cfg)
    check_job_decoder(load_config(None, ["decoder.params.verification=greedy", "generation.temperature=1"]))


def test_draft_path_and_vocabulary_are_checked_before_work(tiny_model, tmp_path):
    with pytest.raises(JobInputError, match=r"decoder\.params\.draft: draft model path not found: '/no/such/draft'"):
        check_decoder("spec_sampling", {"draft": "/no/such/draft"}, model=tiny_model)
    other = save_tiny_model(tmp_path / "other")  # same tokenizer: accepted
    check_decoder("spec_sampling", {"draft": str(other)}, model=tiny_model)
    with pytest.raises(JobInputError, match=rf"target 'smollm2-135m' has 49152 tokens, draft '{other}' has 258"):
        check_decoder("spec_sampling", {"draft": str(other)}, model="smollm2-135m")
    with pytest.raises(JobInputError, match=r"decoder\.params: gamma"):
        check_decoder("topk_imp", {"gamma": 0})
    with pytest.raises(JobInputError, match=r"decoder\.params: .*K"):
        check_decoder("topk_imp", {"K": 0})
