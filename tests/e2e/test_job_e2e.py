"""The whole job through local Ray (2 actors) with a tiny random Llama on synthetic data.

One Ray session serves every test here (module fixture); the model is a tiny random Llama saved with a
byte-level tokenizer so that the real loading path (`laser.load_model(path)`) is used.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from jobs.config import load_config
from pipelines.knowledge import job as jobmod
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.requests import new_requests
from pipelines.knowledge.generation import GenerationWorker
from pipelines.knowledge.records import DecodeTask
from pipelines.workers import GenerationRequest, ModelSpec
from pipelines.store.knowledge import KNOWLEDGE_SCHEMA, read_knowledge
from pipelines.store.shards import read_failures

pytestmark = pytest.mark.slow


def job_config(model: str, out: Path, *extra: str):
    return load_config(
        None,
        [
            "dataset.format=synthetic",
            "dataset.seed=3",
            "dataset.synthetic.n_users=10",
            "dataset.synthetic.n_items=16",
            "dataset.synthetic.n_clusters=2",
            "dataset.synthetic.max_history=10",
            "split.mode=paper",
            "split.max_hist=6",
            f"model.name={model}",
            "model.dtype=float32",
            "decoder.name=laser",
            "decoder.params.verification=greedy",
            "generation.max_new_tokens=24",
            "generation.max_prompt_tokens=2000",
            "routing.n_clusters=2",
            "routing.max_group_size=6",
            "execution.num_workers=2",
            "execution.batch_size=2",
            f"output.path={out}",
            "output.shard_rows=3",
            "generation.degenerate=keep",  # a random tiny model ends no sentence: retry would regenerate every row
            *extra,
        ],
    )


def expected_new_entities(cfg) -> set[tuple[str, str]]:
    data = load_job_data(cfg)
    users = {("user", u) for u in data.split.new_interactions["user_id"].unique().to_list()}
    return users | {("item", i) for i in data.split.new_items["item_id"].to_list()}


def test_job_end_to_end_one_row_per_entity_and_deterministic(tiny_model, ray_session, tmp_path):
    runs = []
    for name in ("a", "b"):
        # a fixed draft budget: K auto follows the cost the session measured, and a loaded machine can tip
        # it to drafting nothing, which would leave the identity below untested
        cfg = job_config(tiny_model, tmp_path / name, "decoder.params.K=8")
        summary = jobmod.run_job(cfg)
        runs.append(read_knowledge(tmp_path / name / "knowledge"))
        assert summary.new.failed == 0 and summary.old.failed == 0
    first, second = runs
    expected = expected_new_entities(cfg)
    keys = list(zip(first["entity_type"], first["entity_id"]))
    assert len(keys) == len(set(keys)) and set(keys) == expected  # every new entity exactly once
    assert summary.total_rows == len(expected) == summary.new.done
    # the schema on disk is the knowledge schema
    shards = sorted((tmp_path / "a" / "knowledge").glob("part-*.parquet"))
    assert pq.read_schema(shards[0]).remove_metadata().equals(KNOWLEDGE_SCHEMA)
    # greedy is deterministic: identical knowledge text, byte for byte, across two runs
    a = first.sort("entity_type", "entity_id")
    b = second.sort("entity_type", "entity_id")
    assert a["knowledge"].to_list() == b["knowledge"].to_list()
    assert a["n_tokens"].to_list() == b["n_tokens"].to_list()
    # rows carry their provenance and consistent stats
    assert set(a["decoder"]) == {"laser"} and set(a["model"]) == {tiny_model}
    assert json.loads(a["decoder_params"][0])["verification"] == "greedy"
    assert (a["n_tokens"] <= 24).all() and (a["n_tokens"] >= 1).all()
    assert set(a["finish_reason"]) <= {"eos", "length"}
    assert (a["accepted_tokens"] >= 0).all()
    routed = a.filter(pl.col("pool_kind").is_not_null())
    assert routed.height > 0 and set(routed["pool_kind"]) <= {"collaborative", "attribute"}
    # old knowledge exists for every old user and existing item, and feeds the pools
    old = read_knowledge(tmp_path / "a" / "old_knowledge")
    data = load_job_data(cfg)
    assert old.height == data.split.old_interactions["user_id"].n_unique() + data.split.existing_items.height
    assert json.loads((tmp_path / "a" / "pools" / "manifest.json").read_text())["pools"]
    summary_json = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary_json["new"]["done"] == len(expected)
    # greedy LASER through pools and Ray wrote exactly plain autoregressive decoding of the same prompts
    requests = new_requests(data.dataset, data.split, {})
    worker = GenerationWorker(ModelSpec(tiny_model, dtype="float32"))
    task = DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000)
    plain = {(r.entity_type, r.entity_id): r.knowledge for r in worker.generate(task, requests).rows}
    assert a["accepted_tokens"].sum() > 0  # drafts were accepted, so the comparison means something
    assert {(t, i): k for t, i, k in a.select("entity_type", "entity_id", "knowledge").iter_rows()} == plain


def test_bad_entity_is_a_failure_row_not_a_crash(tiny_model, tmp_path):
    worker = GenerationWorker(ModelSpec(tiny_model))  # in-process: the same class the actors run
    task = DecodeTask("autoregressive", max_new_tokens=4, max_prompt_tokens=2000, run_id="t")
    result = worker.generate(
        task,
        [
            GenerationRequest("user", "u1", history=[("Heat", 4.0)]),
            GenerationRequest("user", "u2", history=[]),  # empty history: no prompt possible
            GenerationRequest("item", "i1", item={"item_id": "i1", "title": None}),  # no title
            GenerationRequest("item", "i2", item={"item_id": "i2", "title": "Alien", "genres": ["Sci-Fi"]}),
        ],
    )
    assert [r.entity_id for r in result.rows] == ["u1", "i2"]
    assert [(f.entity_id, f.reason.split(":")[0]) for f in result.failures] == [
        ("u2", "ValueError"),
        ("i1", "ValueError"),
    ]
    assert "empty history" in result.failures[0].reason


KILL_SCRIPT = "import sys; from jobs.config import load_config; from pipelines.knowledge.job import run_job; run_job(load_config(sys.argv[1]))"


def test_killed_job_resumes_without_loss_or_duplicates(tiny_model, ray_session, tmp_path):
    """A job driver (a subprocess on this test's Ray cluster) is SIGKILLed mid-generation, then re-run."""
    import ray

    out = tmp_path / "killed"
    cfg = job_config(
        tiny_model,
        out,
        "generation.max_new_tokens=96",
        "old_knowledge.max_new_tokens=8",
        "output.shard_rows=1",
        "execution.batch_size=1",
    )
    config_file = tmp_path / "job.yaml"
    address = ray.get_runtime_context().gcs_address  # the subprocess joins the running cluster
    config_file.write_text(
        yaml.safe_dump(
            cfg.model_copy(update={"execution": cfg.execution.model_copy(update={"address": address})}).model_dump(
                mode="json"
            )
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(config_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    store = out / "knowledge"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(store.glob("part-*.parquet"))) < 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # mid-run: Ray reaps the dead driver's actors
    proc.wait()
    written_before = read_knowledge(store, dedup=False)
    assert 0 < written_before.height < len(expected_new_entities(cfg)), "kill landed outside the new-knowledge step"
    summary = jobmod.run_job(cfg)  # resume in this process
    after = read_knowledge(store, dedup=False)
    keys = list(zip(after["entity_type"], after["entity_id"]))
    assert len(keys) == len(set(keys))  # no duplicates
    assert set(keys) == expected_new_entities(cfg)  # nothing lost
    assert summary.new.done == len(keys) - written_before.height  # only the rest was generated
    before = dict(zip(written_before["entity_id"], written_before["knowledge"]))
    assert all(after.filter(pl.col("entity_id") == k)["knowledge"][0] == v for k, v in before.items())
    assert read_failures(store).height == 0


def test_worker_pool_lru_and_missing_pool(tiny_model, tmp_path):
    from pools.store import TokenizerFingerprint, write_store

    worker = GenerationWorker(ModelSpec(tiny_model))
    ids = worker.tokenizer("a quiet drama about family", add_special_tokens=False)["input_ids"]
    write_store(
        tmp_path / "pools",
        {"user/attribute/a": [ids], "user/attribute/b": [ids], "user/attribute/c": [ids]},
        TokenizerFingerprint.of(worker.tokenizer),
    )
    task = DecodeTask(
        "laser", {"verification": "greedy"}, max_new_tokens=3, pool_store=str(tmp_path / "pools"), pool_cache_size=2
    )
    keys = ["a", "b", "a", "c", "a", "missing"]  # a stays hot, c evicts b, "missing" has no pool
    reqs = [
        GenerationRequest(
            "user", f"u{i}", pool_key=f"user/attribute/{k}", pool_kind="attribute", group_id=k, history=[("Heat", 4.0)]
        )
        for i, k in enumerate(keys)
    ]
    result = worker.generate(task, reqs)
    assert not result.failures
    assert worker.pools.loads == 3  # a, b, c loaded once each; the second and third "a" hit the LRU
    assert list(worker.pools.pools) == ["user/attribute/c", "user/attribute/a"]  # b was least recently used
    assert [r.group_id for r in result.rows] == ["a", "b", "a", "c", "a", None]  # no pool: recorded as none


def test_batch_error_falls_back_to_one_by_one(tiny_model):
    worker = GenerationWorker(ModelSpec(tiny_model))
    task = DecodeTask("autoregressive", max_new_tokens=4, max_prompt_tokens=None)  # no truncation
    huge = [(f"Film number {i}", 3.0) for i in range(400)]  # longer than the model's 4096-token context
    reqs = [
        GenerationRequest("user", "ok1", history=[("Heat", 4.0)]),
        GenerationRequest("user", "huge", history=huge),
        GenerationRequest("user", "ok2", history=[("Alien", 5.0)]),
    ]
    result = worker.generate(task, reqs)
    alone = worker.generate(task, [reqs[0]]).rows[0]
    assert [r.entity_id for r in result.rows] == ["ok1", "ok2"]
    assert result.rows[0].knowledge == alone.knowledge
    assert [f.entity_id for f in result.failures] == ["huge"]
    assert "context" in result.failures[0].reason


def test_actor_exchange_streams_results_and_reports_what_it_holds(tiny_model):
    """The actor's side of streaming: requests go into a background engine with 2 slots; each exchange
    returns what finished (rows equal to a synchronous decode) and the keys still queued or decoding."""
    worker = GenerationWorker(ModelSpec(tiny_model))
    task = DecodeTask("autoregressive", max_new_tokens=12, max_prompt_tokens=None)
    reqs = [GenerationRequest("user", f"u{i}", history=[(f"Film {i}", 4.0), ("Heat", 3.0)]) for i in range(5)]
    expected = {r.entity_id: r.knowledge for r in worker.generate(task, reqs).rows}
    got, held = worker.exchange(task, reqs[:3], slots=2, wait_s=0.0)
    assert held | {("user", r.entity_id) for r in got.rows} == {("user", "u0"), ("user", "u1"), ("user", "u2")}
    rows, deadline = list(got.rows), time.time() + 120
    sent_rest = False
    while len(rows) < 5 and time.time() < deadline:
        got, held = worker.exchange(task, [] if sent_rest else reqs[3:], slots=2, wait_s=0.5)
        sent_rest = True
        rows += got.rows
        assert {("user", r.entity_id) for r in got.rows}.isdisjoint(held)  # a returned row is no longer held
    assert {r.entity_id: r.knowledge for r in rows} == expected
    assert held == set() and got.decode_s >= 0.0
