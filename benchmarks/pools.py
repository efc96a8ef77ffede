"""Benchmark of the routing and pool layer: LightGCN training, pool build/load time, memory, retrieval.

``laser bench pools --json OUT`` runs :func:`run_pools_bench`: LightGCN to early stop on a
MovieLens-100K-sized planted graph (943 x 1682, ~100K ratings), then for each pool size (texts of ~200
tokens with phrase-level repetition, like generated knowledge) the build time and peak memory, the
store's load time (rebuild from token ids, and from a snapshot (plain integers)), and the retrieval time per
decoding step. Every pool size runs in a fresh process so its peak RSS is its own. Writes JSON and a
PNG plot next to it and prints a table.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from pools.build import materialize  # noqa: E402
from pools.store import PoolStore, TokenizerFingerprint, write_store  # noqa: E402
from router.lightgcn import LightGCNConfig, build_graph, popularity_scores, recall_at_k, train_lightgcn  # noqa: E402
from router.synthetic import planted_interactions  # noqa: E402

log = logging.getLogger(__name__)

TARGETS = {
    "lightgcn_s": 60.0,
    "build_2000_s": 20.0,
    "build_2000_mib": 1024.0,
    "load_s": 3.0,
    "retrieval_median_ms": 2.0,
}
_FAKE_TOKENIZER = TokenizerFingerprint("synthetic", "0" * 64)


def synthetic_knowledge_tokens(
    n_texts: int, length: int = 200, vocab: int = 49_152, n_phrases: int = 600, seed: int = 0
) -> list[list[int]]:
    """Token texts built from a Zipf-distributed phrase book (3-8 tokens a phrase) plus 15% random tokens."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, rng.integers(3, 9)).tolist() for _ in range(n_phrases)]
    weights = 1.0 / np.arange(1, n_phrases + 1) ** 1.1
    weights /= weights.sum()
    texts = []
    for _ in range(n_texts):
        text: list[int] = []
        while len(text) < length:
            text += (
                phrases[rng.choice(n_phrases, p=weights)] if rng.random() < 0.85 else rng.integers(0, vocab, 3).tolist()
            )
        texts.append(text[:length])
    return texts


@dataclass
class PoolSizeResult:
    pool_texts: int
    trie_nodes: int
    build_s: float
    build_peak_mib: float  # resident memory after the build minus before it (a trie only grows)
    load_rebuild_s: float  # PoolStore.get from token ids
    load_snapshot_s: float  # PoolStore.get from a snapshot (plain integers)
    retrieval_median_ms: float
    retrieval_p95_ms: float
    mean_draft_nodes: float


def _rss_mib() -> float:
    """Resident memory now (Linux /proc; peak RSS elsewhere, which over-counts imports)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _retrieval_ms(pool, queries: list[list[int]], prompt_len: int = 40, step: int = 3) -> tuple[np.ndarray, float]:
    """Time ``propose`` over simulated decoding: each query's tokens arrive ``step`` at a time."""
    times, nodes = [], []
    for query in queries:
        drafter = pool.open(query[:prompt_len], max_nodes=64, n_max=8)
        for end in range(prompt_len + step, len(query), step):
            started = time.perf_counter()
            tree = drafter.propose(query[:end])
            times.append(time.perf_counter() - started)
            nodes.append(len(tree.tokens) - 1)
            drafter.commit(query[end - step : end])
        drafter.close()
    return np.asarray(times) * 1e3, float(np.mean(nodes))


def _one_size(n_texts: int, seed: int) -> PoolSizeResult:
    """Runs in a fresh process: build, persist, load both ways, retrieve."""
    texts = synthetic_knowledge_tokens(n_texts, seed=seed)
    queries = synthetic_knowledge_tokens(20, seed=seed + 1)
    before = _rss_mib()
    started = time.perf_counter()
    pool = materialize(texts)
    build_s = time.perf_counter() - started
    peak = _rss_mib() - before
    times, mean_nodes = _retrieval_ms(pool, queries)
    nodes = len(pool)
    del pool
    with tempfile.TemporaryDirectory() as tmp:
        write_store(Path(tmp) / "plain", {"bench/attribute/0": texts}, _FAKE_TOKENIZER)
        write_store(Path(tmp) / "snap", {"bench/attribute/0": texts}, _FAKE_TOKENIZER, snapshot=True)
        loads = {}
        for name in ("plain", "snap"):
            started = time.perf_counter()
            PoolStore.open(Path(tmp) / name, _FAKE_TOKENIZER).get("bench/attribute/0")
            loads[name] = time.perf_counter() - started
    return PoolSizeResult(
        n_texts,
        nodes,
        build_s,
        peak,
        loads["plain"],
        loads["snap"],
        float(np.median(times)),
        float(np.percentile(times, 95)),
        mean_nodes,
    )


def _lightgcn(seed: int) -> dict:
    graph = planted_interactions(943, 1682, 100_000, n_clusters=8, in_cluster=0.7, seed=seed)
    config = LightGCNConfig(seed=seed, progress=True)
    result = train_lightgcn(graph.interactions, config)
    split = build_graph(graph.interactions, config.positive_threshold, config.holdout_fraction, seed)
    popularity = recall_at_k(popularity_scores(split.train, split.num_users, split.num_items), split.train, split.test)
    return {
        "ratings": graph.interactions.height,
        "users": 943,
        "items": 1682,
        "train_s": result.train_seconds,
        "best_epoch": result.best_epoch,
        "epochs_run": result.history[-1][0],
        "recall_at_20": result.best_recall,
        "popularity_recall_at_20": popularity,
    }


def run_pools_bench(
    out: Path, sizes: tuple[int, ...] = (500, 1000, 2000, 3000, 5000), seed: int = 0, skip_lightgcn: bool = False
) -> dict:
    """Run the benchmark, print a table, write ``out`` (JSON) and ``out`` with suffix ``.png``."""
    results: dict = {"lightgcn": None if skip_lightgcn else _lightgcn(seed), "pools": [], "targets": TARGETS}
    context = multiprocessing.get_context("spawn")
    for n in sizes:
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as executor:
            results["pools"].append(asdict(executor.submit(_one_size, n, seed).result()))
        log.info("pool of %d texts done", n)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    _plot(results["pools"], out.with_suffix(".png"))
    _print(results)
    return results


def _plot(rows: list[dict], path: Path) -> None:
    sizes = [r["pool_texts"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(sizes, [r["build_s"] for r in rows], "o-", label="build")
    left.plot(sizes, [r["load_rebuild_s"] for r in rows], "s-", label="load (rebuild)")
    left.plot(sizes, [r["load_snapshot_s"] for r in rows], "^-", label="load (snapshot)")
    left.set(xlabel="pool size (texts of 200 tokens)", ylabel="seconds", title="Build and load time")
    left.legend()
    right.plot(sizes, [r["retrieval_median_ms"] for r in rows], "o-", label="median")
    right.plot(sizes, [r["retrieval_p95_ms"] for r in rows], "s-", label="p95")
    right.set(xlabel="pool size (texts of 200 tokens)", ylabel="ms per decoding step", title="Retrieval time")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print(results: dict) -> None:
    console = Console()
    if results["lightgcn"]:
        g = results["lightgcn"]
        console.print(
            f"LightGCN on {g['users']}x{g['items']}, {g['ratings']} ratings: {g['train_s']:.1f} s to early "
            f"stop (best epoch {g['best_epoch']} of {g['epochs_run']}), recall@20 {g['recall_at_20']:.3f} "
            f"vs popularity {g['popularity_recall_at_20']:.3f}"
        )
    table = Table(title="Retrieval pools vs size")
    for name in (
        "texts",
        "trie nodes",
        "build s",
        "build MiB",
        "load rebuild s",
        "load snapshot s",
        "retr. median ms",
        "retr. p95 ms",
        "draft nodes",
    ):
        table.add_column(name, justify="right")
    for r in results["pools"]:
        table.add_row(
            str(r["pool_texts"]),
            f"{r['trie_nodes']:,}",
            f"{r['build_s']:.2f}",
            f"{r['build_peak_mib']:.0f}",
            f"{r['load_rebuild_s']:.2f}",
            f"{r['load_snapshot_s']:.2f}",
            f"{r['retrieval_median_ms']:.3f}",
            f"{r['retrieval_p95_ms']:.3f}",
            f"{r['mean_draft_nodes']:.1f}",
        )
    console.print(table)
