"""The job's steps alone through the CLI (`laser route`, `laser build-pools`) and request building; no Ray."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import polars as pl
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.config import load_config
from laser.decoders import available_decoders
from pipelines.knowledge.job import run_job
from pipelines.knowledge.decoders import resolve_job_decoder
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.requests import new_requests, pool_routes
from pipelines.knowledge.routing import read_routing, step_route
from pipelines.knowledge.summary import JobSummary, print_summary
from pipelines.knowledge.time_account import TimeAccount
from pipelines.workers import encode_params
from pipelines.store.knowledge import KnowledgeWriter


def write_config(tmp_path, model: str):
    path = tmp_path / "job.yaml"
    path.write_text(f"""
dataset: {{format: synthetic, seed: 1, synthetic: {{n_users: 10, n_items: 16, n_clusters: 2, max_history: 10}}}}
split: {{mode: paper, max_hist: 6}}
model: {{name: {json.dumps(model)}, dtype: float32}}
routing: {{n_clusters: 2, max_group_size: 6, warm_threshold: 3}}
output: {{path: {json.dumps(str(tmp_path / "out"))}}}
""")
    return path


def fake_old_knowledge(cfg, data) -> dict[tuple[str, str], str]:
    """Old knowledge for every old user and existing item, written as a job would (texts made up)."""
    texts = {("user", u): f"user {u} likes drama" for u in data.split.old_interactions["user_id"].unique().sort()}
    texts |= {("item", i): f"item {i} is a film" for i in data.split.existing_items["item_id"]}
    with KnowledgeWriter(JobPaths.of(cfg).old_knowledge, shard_rows=4, run_id="old") as w:
        for (t, i), k in texts.items():
            w.add(
                {
                    "entity_type": t,
                    "entity_id": i,
                    "knowledge": k,
                    "model": "m",
                    "decoder": "resd",
                    "decoder_params": encode_params({}),
                    "prompt_version": "v",
                    "pool_kind": None,
                    "group_id": None,
                    "n_tokens": 5,
                    "target_forwards": 5,
                    "accepted_tokens": 0,
                    "retrieval_s": 0.0,
                    "generation_s": 0.1,
                    "finish_reason": "eos",
                    "run_id": "old",
                    "generated_at": datetime(2024, 1, 1, tzinfo=timezone.utc),
                }
            )
    return texts


def test_route_then_build_pools_cli(tiny_model, tmp_path):
    config = write_config(tmp_path, tiny_model)
    cfg = load_config(config)
    data = load_job_data(cfg)
    texts = fake_old_knowledge(cfg, data)
    runner = CliRunner()
    result = runner.invoke(app, ["route", str(config)])
    assert result.exit_code == 0, result.output
    routing = read_routing(cfg)
    assert routing.height == data.dataset.users.height + data.dataset.items.height
    assert routing.filter(pl.col("entity_type") == "item")["pool_kind"].unique().to_list() == ["attribute"]
    counts = dict(data.split.old_interactions.group_by("user_id").len().iter_rows())
    for uid, kind in routing.filter(pl.col("entity_type") == "user").select("entity_id", "pool_kind").iter_rows():
        warm = counts.get(uid, 0) >= 3
        assert kind == ("collaborative" if warm else "attribute"), uid  # warm_cold, falling back when cold

    result = runner.invoke(app, ["build-pools", str(config)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "pools" / "manifest.json").read_text())
    members = pl.read_parquet(tmp_path / "out" / "memberships.parquet")
    # each group pool holds exactly the old knowledge of its members (no cap hit at this size)
    for (etype, kind, group), frame in members.group_by("entity_type", "pool_kind", "group_id"):
        n_texts = sum((etype, e) in texts for e in frame["entity_id"])
        key = f"{etype}/{kind}/{group}"
        assert manifest["pools"].get(key, {}).get("n_texts", 0) == n_texts, key
    assert not [k for k in manifest["pools"] if "/global/" in k]  # laser drafts from group pools alone

    result = runner.invoke(app, ["build-pools", str(config), "--set", "decoder.name=resd"])  # the global pools
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "pools" / "manifest.json").read_text())
    assert set(manifest["pools"]) == {"user/global/all", "item/global/all"}
    assert manifest["pools"]["user/global/all"]["n_texts"] == sum(t == "user" for t, _ in texts)


def test_new_requests_follow_routing_and_decoder(tmp_path):
    cfg = load_config(None, ["dataset.synthetic.n_users=8", "dataset.synthetic.n_items=10", "split.max_hist=4"])
    data = load_job_data(cfg)
    routing = pl.DataFrame(
        {
            "entity_type": ["user", "item"],
            "entity_id": ["u0001", "i0003"],
            "pool_kind": ["collaborative", "attribute"],
            "group_id": ["2", "Drama"],
            "reason": ["warm", "cold"],
        }
    )
    laser_reqs = {
        (r.entity_type, r.entity_id): r
        for r in new_requests(data.dataset, data.split, pool_routes(available_decoders()["laser"].pool, routing))
    }
    expected_users = set(data.split.new_interactions["user_id"])
    assert {i for t, i in laser_reqs if t == "user"} == expected_users
    assert {i for t, i in laser_reqs if t == "item"} == set(data.split.new_items["item_id"])
    assert laser_reqs[("user", "u0001")].pool_key == "user/collaborative/2"
    assert laser_reqs[("item", "i0003")].pool_key == "item/attribute/Drama"
    assert laser_reqs[("item", "i0000")].pool_key is None  # not in the routing table: no pool
    full = pl.concat([data.split.old_interactions, data.split.new_interactions]).filter(pl.col("user_id") == "u0001")
    assert len(laser_reqs[("user", "u0001")].history) == full.height  # old + new history
    resd = {
        (r.entity_type, r.entity_id): r.pool_key
        for r in new_requests(data.dataset, data.split, pool_routes(available_decoders()["resd"].pool, routing))
    }
    assert all(k is None or k.endswith("/global/all") for k in resd.values())
    assert all(
        r.pool_key is None
        for r in new_requests(
            data.dataset, data.split, pool_routes(available_decoders()["autoregressive"].pool, routing)
        )
    )


def test_decoder_checked_before_any_work():
    resolve_job_decoder("laser", {"verification": "greedy", "k": 2})
    with pytest.raises(ValueError, match=r"decoder\.params\.kk: decoder 'laser' takes no parameter 'kk'"):
        resolve_job_decoder("laser", {"kk": 3})
    with pytest.raises(ValueError, match=r"decoder\.name: unknown decoder 'nope'; available: \[.*'autoregressive'"):
        resolve_job_decoder("nope", {})
    with pytest.raises(ValueError, match=r"decoder\.params\.k: decoder 'resd'"):
        run_job(load_config(None, ["decoder.name=resd", "decoder.params.k=2", "output.path=/nonexistent/x"]))


def test_summary_numbers(capsys):
    from pipelines.knowledge.generation import GenerationReport

    from pipelines.quality import text_quality

    new = GenerationReport(
        done=3,
        failed=1,
        n_tokens=40,
        target_forwards=10,
        accepted_tokens=20,
        wall_s=4.0,
        busy_s=3.0,
        decode_s=2.0,
        decode_tokens=60,
        prompt_tokens=400,
        cached_prompt_tokens=100,
        retries=2,
        greedy_retries=1,
        decoded_tokens=60,
        decoded_forwards=20,
        decoded_accepted=40,  # a discarded text of 20
        retry_reasons={"cut": 2, "ungrounded": 1},
        retry_kept={"cut": 1},
        retry_cost={"cut": 30, "ungrounded": 12},
    )
    for text, reason in (
        ("A calm drama fan.", "eos"),
        ("a dark b a dark b a dark b a dark b", "length"),
        ("Likes westerns and old musicals.", "eos"),
    ):
        new.quality.add(text_quality(text, reason))
    assert new.aal == 3.0 and new.tokens_per_s == 10.0 and new.engine_tokens_per_s == 20.0
    assert new.decode_tokens_per_s == 30.0
    summary = JobSummary(
        output="out/knowledge",
        run_id="r",
        old=GenerationReport(),
        new=new,
        total_rows=3,
        open_failures=1,
        wall_s=5.0,
        skipped={"users without interactions": 5},
        input_notes={"sample_dropped_interactions": 12},
        time=TimeAccount(seconds={"load": 1.0, "startup": 2.0, "prefill": 1.5, "first decode": 0.5}, wall_s=5.0),
    )
    print_summary(summary)
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if "new knowledge" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == [
        "new knowledge",
        "3",
        "1",
        "40 (60)",
        "10.0",
        "20.0",
        "30.0",
        "3.00",
        "40 (67%)",
        "400 (25%)",
    ]
    quality_row = [line for line in text.splitlines() if "new knowledge" in line][1]
    assert [c.strip() for c in quality_row.strip("│ ").split("│")] == [
        "new knowledge",
        "3",
        "2 (67%)",
        "22.2%",
        "1",
        "2 (1)",
    ]
    flat = " ".join(text.split())
    assert "including actor start-up, model load" in flat and "prefill excluded on both engines" in flat
    assert "(every step, prefill included" in flat  # what each covers
    assert "unresolved failures: 1" in text and "out/knowledge" in text
    fixed = next(line for line in text.splitlines() if "fixed (all but prefill and decode)" in line)
    assert "where the time went" in text and [c.strip() for c in fixed.strip("│ ").split("│")][1:] == ["3.0", "60%"]
    assert summary.to_json()["time"] == {
        "wall_s": 5.0,
        "fixed_s": 3.0,
        "engine_ready_s": 0.0,
        "seconds": {"load": 1.0, "startup": 2.0, "prefill": 1.5, "first decode": 0.5},
    }
    assert "new knowledge: retried because cut 2 (kept 1, 30 tokens), ungrounded 1 (kept 0, 12 tokens)" in flat
    assert "skipped (no new knowledge): 5 users without interactions" in flat
    assert "sample dropped interactions: 12" in flat
    assert summary.to_json()["skipped"] == {"users without interactions": 5}
    js = summary.to_json()["new"]
    assert js["aal"] == 3.0 and js["tokens_per_s_decode"] == 30.0 and js["decoded_tokens"] == 60
    q = js["quality"]
    assert {k: q[k] for k in ("n", "finished_eos", "eos_share", "degenerate", "mean_repeat_4gram", "ended", "cut")} == {
        "n": 3,
        "finished_eos": 2,
        "eos_share": 0.6667,
        "degenerate": 1,
        "mean_repeat_4gram": 0.2222,
        "ended": 2,
        "cut": 1,
    }


def test_route_notes_when_every_user_goes_to_one_pool_kind(tmp_path):
    cfg = load_config(
        None,
        [
            "dataset.synthetic.n_users=8",
            "dataset.synthetic.n_items=10",
            "split.max_hist=4",
            "routing.warm_threshold=1000",
            f"output.path={tmp_path / 'out'}",
        ],
    )
    data = load_job_data(cfg)
    step_route(cfg, data)
    assert "every user went to the attribute pool" in data.dataset.notes["warning_user_pools"]
