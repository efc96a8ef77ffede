"""`laser bench throughput --engine vllm` without vLLM: the chain-only pool of the tree-vs-chain row, the
targets computed from a report, the cells made of interleaved repeats (median, spread, ties), the methods
filter, the proposer timer and the KV cache size."""

from __future__ import annotations

import json

import pytest

from benchmarks.throughput_vllm import (
    ALL_METHODS,
    HF_RELAXED,
    ChainSource,
    aggregate_level,
    check_vllm_targets,
    engines_to_keep,
    markdown_vllm_throughput,
    select_methods,
    verdict,
)
from benchmarks.vllm_level import ProposeTimer, kv_cache_gib
from pools.retrieval import RetrievalPool


def test_chain_source_drafts_the_first_path_of_the_pool_tree():
    pool = RetrievalPool.from_token_ids([[1, 2, 3, 4], [1, 2, 5], [1, 6]])
    tree = pool.open([9, 1], max_nodes=8).propose([9, 1])
    chain = ChainSource(pool).open([9, 1], 8, 8, 0.0).propose([9, 1])
    assert not tree.is_chain and chain.is_chain
    assert chain.tokens.tolist() == [1, *tree.first_path()] == [1, 2, 3, 4]


def test_engines_kept_for_all_repeats_are_as_many_as_fit_and_never_suffix():
    methods = ["vllm", "vllm ngram", "vllm suffix", "laser-vllm relaxed"]
    engine = 6.5  # GiB of one engine
    assert engines_to_keep(methods, engine, 4 * engine) == ["vllm", "vllm ngram", "laser-vllm relaxed"]  # + suffix
    assert engines_to_keep(methods, engine, 4 * engine - 0.1) == ["vllm", "vllm ngram"]
    assert engines_to_keep(methods, engine, 2 * engine) == ["vllm"]
    assert engines_to_keep(methods, engine, engine) == []
    assert engines_to_keep(["vllm", "laser-vllm relaxed"], engine, 2 * engine) == ["vllm", "laser-vllm relaxed"]
    assert engines_to_keep(["vllm suffix"], engine, 100) == []


def _level(**tps):
    return {name: {"tokens_per_s": v, "identical_to_vllm": 4, "prompts": 4} for name, v in tps.items()}


def test_targets_use_the_worst_concurrency():
    names = ["vllm", "vllm ngram", "vllm suffix", "laser-vllm greedy", "laser-vllm relaxed", HF_RELAXED]
    report = {
        "levels": {
            "1": _level(**dict(zip(names, [10, 12, 15, 14, 20, 9]))),
            "4": _level(**dict(zip(names, [30, 33, 36, 31, 35, 40]))),
        }
    }
    got = {t["target"]: t for t in check_vllm_targets(report)}
    assert got["laser-vllm relaxed never below vllm (worst concurrency)"]["value"] == 35 / 30
    assert not got["laser-vllm relaxed vs vllm at concurrency 1 and 4 (worse of the two)"]["met"]  # 35/30 < 1.3
    assert got["laser-vllm relaxed ahead of vllm suffix (worst concurrency)"]["value"] == 35 / 36
    best = got["the better of our two engines ahead of every vLLM row (worst concurrency)"]
    assert best["value"] == min(20 / 15, 40 / 36) and best["met"]


# ---- repeats, spreads, ties and the drafting columns ----------------------------------------------------
def _run(tokens, wall, outputs=((1, 2),), **extra):
    return {"tokens": tokens, "wall_s": wall, "outputs": [list(o) for o in outputs], **extra}


def test_a_cell_reports_the_median_and_spread_of_its_repeats_and_ties_only_with_overlap_and_ratio():
    runs = {
        "vllm": [_run(100, 1.0, prefill_s=0.5), _run(100, 1.25), _run(100, 0.8)],  # 100, 80, 125 tok/s
        "laser-vllm relaxed": [
            _run(99, 1.0, proposer_ms_per_step=2.0, mean_draft_len=1.5, aal=2.0),
            _run(99, 1.1, proposer_ms_per_step=4.0, mean_draft_len=0.5, aal=2.2),
            _run(99, 0.9, proposer_ms_per_step=3.0, mean_draft_len=1.0, aal=2.1),
        ],
        "vllm ngram": [_run(50, 1.0, outputs=((9,),)), _run(50, 1.0, outputs=((9,),))],
    }
    level = aggregate_level(runs, prefill_by="vllm")
    ref, rel, ng = level["vllm"], level["laser-vllm relaxed"], level["vllm ngram"]
    assert ref["tokens_per_s"] == 100 and ref["tokens_per_s_min"] == 80 and ref["tokens_per_s_max"] == 125
    assert sorted(ref["tokens_per_s_runs"]) == [80, 100, 125] and ref["repeats"] == 3
    assert rel["tokens_per_s"] == pytest.approx(99) and rel["speedup_vs_vllm"] == pytest.approx(0.99)
    assert rel["vs_vllm"] == "tie" and ref["vs_vllm"] is None  # 0.99 >= 0.98 and the spreads overlap
    assert ng["vs_vllm"] == "slower" and ng["identical_to_vllm"] == 0 and rel["identical_to_vllm"] == 1
    assert rel["proposer_ms_per_step"] == 3.0 and rel["mean_draft_len"] == 1.0 and rel["aal"] == pytest.approx(2.1)
    assert rel["prefill_s"] == 0.5 and rel["decode_tokens_per_s"] == pytest.approx(99 / 0.5)  # vllm's prefill
    assert "_outputs" not in rel and json.dumps(level)


def test_verdict_needs_overlapping_spreads_and_a_ratio_of_0_98():
    a = {"tokens_per_s": 97, "tokens_per_s_min": 90, "tokens_per_s_max": 105}
    b = {"tokens_per_s": 100, "tokens_per_s_min": 95, "tokens_per_s_max": 104}
    assert verdict(a, b) == "slower"  # overlap, but 0.97 < 0.98
    assert verdict({**a, "tokens_per_s": 99}, b) == "tie"
    assert verdict({"tokens_per_s": 110, "tokens_per_s_min": 108, "tokens_per_s_max": 112}, b) == "faster"
    assert (
        verdict(
            {"tokens_per_s": 99, "tokens_per_s_min": 98.5, "tokens_per_s_max": 99.5},
            {"tokens_per_s": 100, "tokens_per_s_min": 99.8, "tokens_per_s_max": 100.2},
        )
        == "slower"
    )


def test_a_never_below_target_is_met_when_every_cell_below_is_a_tie():
    def cell(v, lo, hi):
        return {"tokens_per_s": v, "tokens_per_s_min": lo, "tokens_per_s_max": hi, "identical_to_vllm": 4, "prompts": 4}

    report = {
        "levels": {
            "1": {"vllm": cell(10, 9, 11), "laser-vllm relaxed": cell(20, 19, 21)},
            "64": {"vllm": cell(100, 95, 104), "laser-vllm relaxed": cell(99, 96, 101)},
        }
    }
    got = {t["target"]: t for t in check_vllm_targets(report)}
    t = got["laser-vllm relaxed never below vllm (worst concurrency)"]
    assert t["value"] == pytest.approx(0.99) and t["ties"] == [64] and t["met"]
    report["levels"]["64"]["laser-vllm relaxed"] = cell(90, 88, 92)
    t = {t["target"]: t for t in check_vllm_targets(report)}["laser-vllm relaxed never below vllm (worst concurrency)"]
    assert not t["met"] and "ties" not in t


def test_methods_filter_keeps_the_report_order_and_names_unknown_rows():
    assert select_methods(()) == list(ALL_METHODS)
    assert select_methods(["laser-vllm relaxed", "vllm"]) == ["vllm", "laser-vllm relaxed"]
    with pytest.raises(ValueError, match="known: transformers generate"):
        select_methods(["vllm", "vllm-suffix"])


def test_markdown_has_spread_and_drafting_columns():
    level = aggregate_level(
        {
            "vllm": [_run(100, 1.0, prefill_s=0.2), _run(100, 0.5)],
            "laser-vllm greedy": [
                _run(120, 1.0, proposer_ms_per_step=1.25, mean_draft_len=2.5),
                _run(120, 1.0, proposer_ms_per_step=1.25, mean_draft_len=2.5),
            ],
        }
    )
    report = {
        "levels": {"4": level},
        "machine": {},
        "settings": {"repeats": 2},
        "absent": {},
        "targets": [],
        "engine_reuse": {
            "4": {"kv_cache_gib": 2, "one_engine_for_all_repeats": ["vllm"], "fresh_engine_per_repeat": []}
        },
    }
    md = markdown_vllm_throughput(report)
    assert "150.0 [100.0-200.0]" in md and "120.0 [120.0-120.0] (0.80x slower)" in md
    assert "1.2 ms/step, draft 2.50/row" in md and "one engine for all repeats: vllm" in md
    # prompts per minute: vllm's one prompt in 1.0 s and 0.5 s (median 90), greedy's in 1.0 s twice
    assert "90.0 [60.0-120.0] (1.00x)" in md and "60.0 [60.0-60.0] (0.67x)" in md


def test_propose_timer_counts_decoding_rows_and_their_drafts():
    class Fake:
        def propose(self, sampled, num_tokens, token_ids, **kw):
            return [[7] * len(s) for s in sampled]

    p = Fake()
    timer = ProposeTimer(p)
    assert p.propose([[1, 2], [], [3]], None, None) == [[7, 7], [], [7]]
    p.propose([[1]], None, None)
    s = timer.summary()
    assert s["proposer_steps"] == 2 and s["mean_draft_len"] == 4 / 3 and s["proposer_ms_per_step"] >= 0
    timer.reset()
    assert timer.summary()["proposer_steps"] == 0 and timer.summary()["mean_draft_len"] is None


def test_kv_cache_holds_every_request_in_flight(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30})
    )
    per_token = 2 * 30 * 3 * 64 * 4
    assert kv_cache_gib(str(tmp_path), [100]) == 1
    assert kv_cache_gib(str(tmp_path), [624] * 128) == -(-(624 * 128 * per_token * 1.25) // 1024**3)  # 5 GiB


def test_the_report_counts_looping_and_ended_texts_per_row():
    """A looping text is counted as degenerate, a text that stopped before the limit as ended by EOS."""
    from benchmarks.throughput_vllm import texts_quality

    words = {1: "the", 2: "cat", 3: "sat", 4: "on", 5: "a", 6: "mat", 7: "today", 8: "."}
    tok = type(
        "Tok",
        (),
        {"batch_decode": lambda self, outs, skip_special_tokens=True: [" ".join(words[t] for t in o) for o in outs]},
    )()
    loop = (1, 2, 3, 4) * 3  # "the cat sat on" three times, up to the limit
    plain = (1, 2, 3, 4, 5, 6, 7, 8)
    level = aggregate_level(
        {
            "vllm": [_run(100, 1.0, outputs=(plain, plain))],
            "laser-vllm relaxed": [_run(100, 1.0, outputs=(plain, loop))],
        },
        quality=texts_quality(tok, max_new_tokens=12),
    )
    assert level["vllm"]["texts"] == {"n": 2, "degenerate": 0, "finished_eos": 2, "mean_repeat_4gram": 0.0}
    rel = level["laser-vllm relaxed"]["texts"]
    assert rel["degenerate"] == 1 and rel["finished_eos"] == 1
    report = {"levels": {"1": level}, "machine": {}, "settings": {"repeats": 1}, "absent": {}, "targets": []}
    assert "| laser-vllm relaxed | 1 loop, 1 EOS / 2 |" in markdown_vllm_throughput(report)
