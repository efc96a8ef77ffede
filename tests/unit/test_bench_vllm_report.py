"""`laser bench throughput --engine vllm` without vLLM: the chain-only pool of the tree-vs-chain row and the
targets computed from a report."""
from __future__ import annotations

from pipelines.tools.bench.throughput_vllm import HF_RELAXED, ChainSource, check_vllm_targets
from pools.retrieval import RetrievalPool


def test_chain_source_drafts_the_first_path_of_the_pool_tree():
    pool = RetrievalPool.from_token_ids([[1, 2, 3, 4], [1, 2, 5], [1, 6]])
    tree = pool.open([9, 1], max_nodes=8).propose([9, 1])
    chain = ChainSource(pool).open([9, 1], 8, 8, 0.0).propose([9, 1])
    assert not tree.is_chain and chain.is_chain
    assert chain.tokens.tolist() == [1, *tree.first_path()] == [1, 2, 3, 4]


def _level(**tps):
    return {name: {"tokens_per_s": v, "identical_to_vllm": 4, "prompts": 4} for name, v in tps.items()}


def test_targets_use_the_worst_concurrency():
    names = ["vllm", "vllm ngram", "vllm suffix", "laser-vllm greedy", "laser-vllm relaxed", HF_RELAXED]
    report = {"levels": {"1": _level(**dict(zip(names, [10, 12, 15, 14, 20, 9]))),
                         "4": _level(**dict(zip(names, [30, 33, 36, 31, 35, 40])))}}
    got = {t["target"]: t for t in check_vllm_targets(report)}
    assert got["laser-vllm relaxed never below vllm (worst concurrency)"]["value"] == 35 / 30
    assert not got["laser-vllm relaxed vs vllm at concurrency 1 and 4 (worse of the two)"]["met"]  # 35/30 < 1.3
    assert got["laser-vllm relaxed ahead of vllm suffix (worst concurrency)"]["value"] == 35 / 36
    best = got["the better of our two engines ahead of every vLLM row (worst concurrency)"]
    assert best["value"] == min(20 / 15, 40 / 36) and best["met"]
