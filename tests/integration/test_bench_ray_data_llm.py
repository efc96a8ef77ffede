"""The `ray-data-llm` row of `laser bench engines` on a tiny random model: its prompts are the token ids the
job's workers would feed the model, and the row runs end to end through Ray Data LLM on vLLM's CPU build
(a fresh process, as the bench runs it). Skipped without vLLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import polars as pl
import pytest
import yaml

pytest.importorskip("vllm")

from jobs.config import load_config  # noqa: E402
from benchmarks import engines, ray_data_llm  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(
        save_tiny_model(tmp_path_factory.mktemp("ray-data-llm") / "tiny", hidden_size=128)
    )  # vLLM CPU: heads >= 32 wide


def _config(tmp_path, model: str, **extra) -> str:
    tree = {
        "dataset": {
            "format": "synthetic",
            "seed": 3,
            "limit_users": 2,
            "limit_items": 3,
            "synthetic": {"n_users": 10, "n_items": 16, "n_clusters": 2, "max_history": 10},
        },
        "split": {"mode": "paper", "max_hist": 6, "new_item_fraction": 0.5},
        "model": {"name": model, "dtype": "float32"},
        "decoder": {"name": "laser", "params": {"verification": "greedy"}},
        "generation": {"max_new_tokens": 6, "max_prompt_tokens": 2000, "degenerate": "keep"},
        "routing": {"n_clusters": 2, "max_group_size": 6},
        "execution": {"num_workers": 1, "threads_per_worker": 1, "batch_size": 2},
        "output": {"path": str(tmp_path / "unused")},
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


@pytest.mark.parametrize("ban", [False, True])
def test_prompts_are_the_token_ids_the_jobs_workers_feed_the_model(tiny, tmp_path, ban):
    """...and each row's rules are the job's first text's (with the genre ban when the job bans genres)."""
    import laser
    from laser.decoders.base import Decoder
    from laser.vllm.forms import rule_params
    from pipelines.knowledge.retry import GenreBan, first_rules
    from pipelines.knowledge.decoders import new_knowledge_decoder, old_knowledge_decoder
    from pipelines.knowledge.generation import GenerationWorker
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.job import knowledge_task
    from pipelines.knowledge.requests import new_requests, old_requests

    generation = {"max_new_tokens": 6, "max_prompt_tokens": 2000, "degenerate": "keep", "ban_unsupported_genres": ban}
    cfg = load_config(_config(tmp_path, tiny, generation=generation))
    lm = laser.load_model(tiny, device="cpu", dtype="float32")
    genre_ban = GenreBan(lm.tokenizer)
    rows = ray_data_llm.job_prompts(cfg, lm.tokenizer)
    data = load_job_data(cfg)
    worker = SimpleNamespace(lm=lm, tokenizer=lm.tokenizer)  # what the worker's prompt and the decoders' encode read
    for name, reqs, task in (
        (
            "old",
            old_requests(data.dataset, data.split),
            knowledge_task(cfg, old_knowledge_decoder(cfg), "r", data.dataset.domain, None, greedy=True),
        ),
        (
            "new",
            new_requests(data.dataset, data.split, {}),
            knowledge_task(cfg, new_knowledge_decoder(cfg), "r", data.dataset.domain, None),
        ),
    ):
        assert [(r["entity_type"], r["entity_id"]) for r in rows[name]] == [(q.entity_type, q.entity_id) for q in reqs]
        for row, req in zip(rows[name], reqs):
            assert row["tokenized_prompt"] == Decoder.encode(worker, GenerationWorker.prompt(worker, task, req))
            assert row["max_tokens"] == task.max_new_tokens
            assert row["rule_params"] == rule_params(first_rules(task, req, genre_ban), lm.tokenizer)
    assert rows["old"] and rows["new"] and not rows["failed"]
    assert any("bad_words" in r["rule_params"] for r in rows["new"]) == ban


@pytest.mark.slow
def test_ray_data_llm_row_runs_the_jobs_new_entities_end_to_end(tiny, tmp_path):
    """One fresh process through `laser bench engines` (new pass only: the old pass is the same code with
    other prompts, and each pass pays a vLLM start of a minute or more on a loaded CPU)."""
    config = _config(tmp_path, tiny, old_knowledge={"generate_missing": False})
    out = tmp_path / "bench" / "engines.json"
    result = engines.run_engines_bench(out, config, tmp_path / "work", ("ray-data-llm",), repeats=1, cold=False)
    run = result["median"]["ray-data-llm"]
    expected = ray_data_llm.job_prompts(load_config(config), _tokenizer(tiny))["new"]
    assert run["old"]["entities"] == 0 and run["new"]["entities"] == len(expected) >= 2 and run["new"]["failed"] == 0
    assert run["new"]["tokens"] <= 6 * len(expected) and run["entities_per_min"] > 0
    new = run["new"]  # the running rate counts from the engine's readiness, read from Ray Data's stage timings
    assert 0 < new["engine_ready_s"] < new["first_row_s"] <= new["wall_s"]
    assert new["running_entities_per_min"] == pytest.approx(
        60 * new["entities"] / (new["wall_s"] - new["engine_ready_s"])
    )
    rows = pl.read_parquet(tmp_path / "work" / "ray-data-llm-warm0" / "new_knowledge.parquet")
    assert sorted(zip(rows["entity_type"], rows["entity_id"])) == sorted(
        (r["entity_type"], r["entity_id"]) for r in expected
    )
    assert (rows["error"] == "").all() and (rows["n_tokens"] >= 1).all()
    saved = json.loads(out.read_text())
    assert saved["runs"][0]["phase"] == "warm" and out.with_suffix(".md").exists() and out.with_suffix(".png").exists()


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_engines_get_the_jobs_kv_blocks_and_start_up_settings(tiny, tmp_path, monkeypatch):
    """Prefix caching as the job's engines have it: the same KV block size (32 tokens on CPU)."""
    from laser.vllm.env import default_block_size

    cfg = load_config(_config(tmp_path, tiny), [])
    kwargs = ray_data_llm.processor_config(cfg, tiny, "none").engine_kwargs
    assert kwargs["enable_prefix_caching"] and kwargs.get("block_size") == default_block_size()
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)  # an earlier engine in this process may have set it
    env = ray_data_llm.engine_env(2)
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env.get("VLLM_USE_AOT_COMPILE") == ("0" if default_block_size() else None)  # CPU: the compile cache
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
