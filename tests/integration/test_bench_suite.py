"""Benchmark suite: summary metrics on hand-made stats, the fixture cache, and the suite end to end on a
tiny random model (no bundled model, no timing claims)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

import laser
import router
from laser import DecodeStats
from benchmarks.fixture import greedy_knowledge
from benchmarks.report import Run, method_metrics, repeat_median, summarise
from benchmarks.suite import (
    GREEDY_METHODS,
    PROMPT_LOOKUP,
    REFERENCE,
    SuiteSettings,
    TaskFixture,
    check_targets,
    run_studies,
)
from router.groups import GROUP_SCHEMA


def _stats(accepted: list[int], **times: float) -> DecodeStats:
    return DecodeStats(
        target_forwards=len(accepted), accepted_per_step=accepted, new_tokens=sum(accepted) + len(accepted), **times
    )


def test_method_metrics_by_hand():
    reference = [Run([5, 6, 7, 8], 2.0), Run([9, 9], 2.0)]  # 6 tokens in 4 s: 1.5 tokens/s
    runs = [
        Run([5, 6, 7, 8], 0.5, _stats([3], prefill_s=0.1, retrieval_s=0.01, forward_s=0.3, decode_s=0.4)),
        Run(
            [9, 9, 9],
            0.5,
            _stats(
                [0, 1],
                prefill_s=0.1,
                retrieval_s=0.03,
                tree_s=0.02,
                verify_s=0.02,
                cache_s=0.01,
                forward_s=0.2,
                decode_s=0.3,
            ),
        ),
    ]
    m = method_metrics(runs, reference)
    assert m["tokens_per_s"] == pytest.approx(7.0)  # 7 tokens / 1 s
    assert m["speedup_vs_generate"] == pytest.approx(7.0 / 1.5)
    assert m["aal"] == pytest.approx((3 + 0 + 1 + 3) / 3)  # (accepted + steps) / steps
    assert m["art_ms_per_step"] == pytest.approx(1000 * 0.04 / 3)
    assert m["art_ms_per_request"] == pytest.approx(1000 * 0.04 / 2)
    assert m["retrieval_share"] == pytest.approx(0.04)
    assert m["overhead_share_of_step"] == pytest.approx((0.04 + 0.02 + 0.02 + 0.01) / 0.7)
    assert m["mean_new_tokens"] == pytest.approx(3.5)
    assert m["length_ratio_vs_greedy"] == pytest.approx(7 / 6)
    assert m["identical_to_greedy"] is False and m["identical_prompts"] == 1
    per_step = m["time_breakdown_ms_per_step"]
    assert per_step["prefill_per_request"] == pytest.approx(100.0)
    assert per_step["forward"] == pytest.approx(1000 * 0.5 / 3)
    assert per_step["other"] == pytest.approx(1000 * 0.7 / 3 - 1000 * (0.04 + 0.02 + 0.5 + 0.02 + 0.01) / 3)


def test_method_quality_per_decoder():
    loop = "a dark underbelly with a dark underbelly with a dark underbelly with a dark underbelly"
    reference = [Run([1], 1.0, text="A quiet drama fan who likes westerns.", finish_reason="eos")] * 2
    runs = [
        Run([1], 1.0, text=loop, finish_reason="length"),
        Run([1], 1.0, text="A quiet drama fan who likes westerns.", finish_reason="eos"),
    ]
    q = method_metrics(runs, reference)["quality"]
    assert (q["n"], q["finished_eos"], q["degenerate"]) == (2, 1, 1)
    assert method_metrics(reference, reference)["quality"]["degenerate"] == 0
    assert method_metrics([Run([1], 1.0)], [Run([1], 1.0)])["quality"] is None  # no text: no figures


def test_summarise_reference_and_methods_without_stats():
    rows = {"ref": [Run([1, 2], 1.0)], "same": [Run([1, 2], 0.5)]}
    out = summarise(rows, "ref")
    assert out["ref"]["speedup_vs_generate"] == pytest.approx(1.0) and out["ref"]["identical_to_greedy"]
    assert out["same"]["speedup_vs_generate"] == pytest.approx(2.0)
    assert out["same"]["aal"] is None and out["same"]["time_breakdown_ms_per_step"] is None
    with pytest.raises(ValueError, match="1 runs against 2"):
        method_metrics([Run([1], 1.0)], [Run([1], 1.0), Run([2], 1.0)])


def test_repeat_median_takes_the_middle_time():
    times = iter([3.0, 1.0, 2.0])
    assert repeat_median(lambda: Run([1], next(times)), 3).seconds == 2.0


def test_check_targets_ratios():
    def row(tps, ratio=1.0, same=True):
        return {"tokens_per_s": tps, "length_ratio_vs_greedy": ratio, "identical_to_greedy": same}

    m = {
        REFERENCE: row(10),
        PROMPT_LOOKUP: row(20),
        "GRP (resd)": row(20),
        "CRP": row(25),
        "LASER (RV+CRP)": row(32, ratio=1.05),
        "autoregressive": row(9),
        "RRP": row(20, same=False),
    }
    got = {t["target"]: t for t in check_targets(m)}
    assert (
        got["relaxed LASER (CRP) vs generate"]["value"] == pytest.approx(3.2)
        and got["relaxed LASER (CRP) vs generate"]["met"]
    )
    assert got["greedy LASER (CRP) vs generate"]["met"]
    assert got["LASER vs ReSD"]["value"] == pytest.approx(1.6) and got["LASER vs ReSD"]["met"]
    assert not got["LASER vs prompt lookup"]["met"]  # 1.6 < 1.8
    assert got["relaxed length within 10% of greedy"]["met"]
    assert (
        not got["greedy methods identical to greedy"]["met"] and got["greedy methods identical to greedy"]["value"] == 3
    )


@pytest.fixture(scope="module")
def tiny():
    return laser.tiny_llama(vocab_size=96, seed=3)


def _prompts(rng: np.random.Generator, n: int, prefix: str) -> dict[str, list[int]]:
    return {f"{prefix}{i}": [int(t) for t in rng.integers(2, 96, size=10)] for i in range(n)}


def test_greedy_knowledge_is_cached_by_prompt_content(tiny, tmp_path):
    prompts = _prompts(np.random.default_rng(0), 3, "u")
    first = greedy_knowledge(tiny, prompts, 6, tmp_path, batch_size=2)
    expected = {e: laser.get_decoder("autoregressive", tiny).generate(ids, 6).token_ids for e, ids in prompts.items()}
    assert first == {e: ids[:-1] if ids[-1] in tiny.eos_ids else ids for e, ids in expected.items()}
    (cache,) = tmp_path.glob("greedy-*.json")
    cache.write_text(json.dumps({k: [7, 7] for k in json.loads(cache.read_text())}))  # prove the cache is read
    assert set(map(tuple, greedy_knowledge(tiny, prompts, 6, tmp_path).values())) == {(7, 7)}
    more = greedy_knowledge(tiny, {**prompts, "u9": [3, 4, 5]}, 6, tmp_path)  # only the new prompt is generated
    fresh = laser.get_decoder("autoregressive", tiny).generate([3, 4, 5], 6).token_ids
    assert more["u9"] == (fresh[:-1] if fresh[-1] in tiny.eos_ids else fresh) and more["u0"] == [7, 7]


def _task(tiny, tmp_path, etype: str, kind: str, seed: int) -> TaskFixture:
    rng = np.random.default_rng(seed)
    old = _prompts(rng, 6, "old")
    knowledge = greedy_knowledge(tiny, old, 16, tmp_path)
    prompts = {f"new{i}": old[f"old{i}"][:7] + [int(t) for t in rng.integers(2, 96, size=3)] for i in range(2)}
    ids = sorted(old) + sorted(prompts)
    groups = pl.DataFrame({"entity_id": ids, "group_id": [str(i % 2) for i in range(len(ids))]}, schema=GROUP_SCHEMA)
    empty = pl.DataFrame(schema=GROUP_SCHEMA)
    members = (
        router.group_memberships(etype, empty, groups)
        if kind == router.COLLABORATIVE
        else router.group_memberships(etype, groups)
    )
    return TaskFixture(etype, kind, prompts, knowledge, members)


@pytest.mark.slow
def test_suite_end_to_end_on_a_tiny_model(tiny, tmp_path):
    tasks = {
        "user": _task(tiny, tmp_path, "user", router.COLLABORATIVE, 1),
        "item": _task(tiny, tmp_path, "item", router.ATTRIBUTE, 2),
    }
    settings = SuiteSettings(model=tiny.name, max_new_tokens=12, pool_fractions=(0.5, 1.0), draft_budgets=(4, 64))
    out = tmp_path / "out" / "suite.json"
    report = run_studies(tiny, tasks, settings, out)
    saved = json.loads(out.read_text())
    assert saved["tasks"].keys() == {"user", "item"}
    user = saved["tasks"]["user"]["methods"]
    keys = {
        "tokens_per_s",
        "speedup_vs_generate",
        "aal",
        "art_ms_per_step",
        "mean_new_tokens",
        "length_ratio_vs_greedy",
        "identical_to_greedy",
        "time_breakdown_ms_per_step",
    }
    assert all(keys <= set(m) for m in user.values())
    half = round(0.5 * len([ids for ids in tasks["user"].knowledge.values() if ids]))
    for name in GREEDY_METHODS + (f"GRP (resd) {half} texts", "LASER K=4"):
        assert name in user and (name == "LASER K=4" or user[name]["identical_to_greedy"]), name
    assert saved["tasks"]["item"]["methods"]["CRP"]["identical_to_greedy"]
    assert user[REFERENCE]["speedup_vs_generate"] == pytest.approx(1.0)
    assert user["CRP"]["aal"] >= 1.0 and user["autoregressive"]["aal"] == pytest.approx(1.0)
    fixture = saved["tasks"]["user"]["fixture"]
    texts = [e for e, ids in sorted(tasks["user"].knowledge.items()) if ids]  # empty answers make no pool text
    in_group0 = [e for e in texts if int(e.removeprefix("old")) % 2 == 0]
    assert fixture["pools"]["user/global/all"]["texts"] == len(texts) >= 4
    assert fixture["pools"]["user/collaborative/0"]["texts"] == len(in_group0)
    assert fixture["pools"]["user/random/collaborative.0"]["texts"] == len(in_group0)
    assert fixture["prompts_without_group_pool"] == 0
    assert [row["texts"] for row in saved["studies"]["pool_size"]] == [half, len(texts)]
    assert {"machine", "versions", "seeds", "settings", "targets", "duration_s"} <= set(saved)
    assert sorted(p.name for p in out.parent.glob("*.png")) == [
        "suite-ablation.png",
        "suite-draft-budget.png",
        "suite-pool-size.png",
        "suite-verification.png",
    ]
    assert report["tasks"]["user"]["methods"]["CRP"]["mean_new_tokens"] == user["CRP"]["mean_new_tokens"]
    markdown = (out.parent / "suite.md").read_text()
    assert "| LASER (RV+CRP) |" in markdown and "**item task** (2 prompts" in markdown


def test_cli_rejects_a_bad_dataset_config_naming_the_file(tmp_path):
    from typer.testing import CliRunner

    from jobs.cli import app

    bad = tmp_path / "data.yaml"
    bad.write_text("dataset:\n  format: synthetic\n  n_users: 5\n")  # n_users belongs under synthetic:
    result = CliRunner().invoke(
        app, ["bench", "suite", "--quick", "--dataset-config", str(bad)], env={"COLUMNS": "400"}
    )
    assert result.exit_code != 0
    assert "data.yaml: not a dataset config" in result.output and "n_users" in result.output


@pytest.mark.slow
def test_redrafter_study_on_a_tiny_model(tiny, tmp_path, monkeypatch):
    from laser.decoders.redrafter.head import RecurrentDraftHead
    from benchmarks.redrafter_study import run_redrafter_study

    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path / "cache"))
    RecurrentDraftHead(tiny.model, "tied").save(tmp_path / "cache" / "heads" / "h.pt", {"model": tiny.name})
    settings = SuiteSettings(
        model=tiny.name, max_new_tokens=10, redrafter_head="h", redrafter_widths=(1, 2), redrafter_lengths=(3,)
    )
    prompts = _prompts(np.random.default_rng(3), 2, "u")
    out = tmp_path / "study.json"
    run_redrafter_study(tiny, prompts, settings, out)
    saved = json.loads(out.read_text())
    names = set(saved["methods"])
    assert names == {
        REFERENCE,
        "autoregressive",
        "redrafter BW=1 L=3",
        "redrafter BW=2 L=3",
        "redrafter BW=2 L=3 no-dedup",
    }
    for name in names - {REFERENCE, "autoregressive"}:
        m = saved["methods"][name]
        assert m["identical_to_greedy"] and 1.0 <= m["aal"] <= 3.0
        assert 1.0 <= m["tree_nodes_per_step"] <= m["undeduplicated_nodes"]
        assert 0.0 <= m["drafting_share_of_step"] <= 1.0
    assert saved["methods"]["redrafter BW=2 L=3 no-dedup"]["tree_nodes_per_step"] == 5.0
    assert [t["met"] for t in saved["targets"]][2] is True
    assert (tmp_path / "study-redrafter.png").exists() and "| redrafter BW=2 L=3 |" in out.with_suffix(
        ".md"
    ).read_text()
    with pytest.raises(ValueError, match="not found"):
        run_redrafter_study(tiny, prompts, SuiteSettings(redrafter_head="missing"), out)
