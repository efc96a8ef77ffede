"""`laser bench lightgcn`: LightGCN trained as before issue 47 vs the linear training, on a MovieLens folder.

Rows, each trained in a fresh process (so its peak RSS is its own) on the dataset's interactions:

- **per-batch**: the earlier training: a full-graph propagation for every mini-batch of ``batch_size``
  positives (an epoch ``O(P^2 / batch_size)``) and a dense users x items score matrix at each evaluation;
- **per-batch, seed+1**: the same with the next seed: how far K-means groups move between two trainings
  of the earlier kind, the yardstick for the agreement of the others;
- **linear**: :func:`router.lightgcn.train_lightgcn` as it is (``propagations_per_epoch`` steps an epoch,
  chunked and sampled evaluation);
- **warm**: the linear training on the interactions without the newest ``warm_share`` of them, then a
  warm start (``init``) on all of them; the row times the warm run.

Each row runs with ``threads`` torch threads (default 1: on a shared machine two threads wait on each
other). Each row: epochs, mean seconds of a training epoch (evaluation excluded), seconds to the end, peak
RSS (and its part above the RSS training started from), best recall@20 on the held-out positives (same
split for every row but seed+1; the warm row's is optimistic: some of its held-out positives were training
positives of the run it starts from), and the agreement of its K-means groups (``n_clusters``, seed 0)
with the per-batch row's: adjusted Rand index over the users, and over the items. Prints a table and
writes JSON.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECALL_TOLERANCE = 0.05  # the linear row's recall@20 within 5% of the per-batch row's


@dataclass
class Row:
    """One training's measurements (vectors kept for the agreement, not written)."""

    name: str
    epochs: int
    best_epoch: int
    epoch_s: float
    train_s: float
    peak_rss_mib: float
    train_rss_mib: float  # the peak above the RSS training started from
    recall_at_20: float
    ari_users: float | None = None
    ari_items: float | None = None
    vectors: dict[str, Any] = field(default_factory=dict, repr=False)


def train_per_batch(interactions, config):
    """LightGCN trained as before issue 47 (for comparison): a full-graph propagation (COO, autograd's
    transpose in the backward) for every mini-batch of ``config.batch_size`` positives, and a dense
    users x items score matrix at each evaluation. Returns a :class:`router.lightgcn.LightGCNResult`."""
    import torch

    import router.lightgcn as lg
    from router.embeddings import Embeddings

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    graph = lg.build_graph(interactions, config.positive_threshold, config.holdout_fraction, config.seed)
    adjacency = lg.normalized_adjacency(graph.train, graph.num_users, graph.num_items)
    model = lg.LightGCN(graph.num_users, graph.num_items, config.embedding_dim, config.num_layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    train = torch.as_tensor(graph.train, dtype=torch.long)
    generator = torch.Generator().manual_seed(config.seed)
    best, history, waited, epoch_time = (-1.0, 0, model.embedding.weight.detach().clone()), [], 0, 0.0
    for epoch in range(1, config.max_epochs + 1):
        tick = time.perf_counter()
        _per_batch_epoch(model, adjacency, train, optimizer, config, generator)
        epoch_time += time.perf_counter() - tick
        if epoch % config.eval_every and epoch != config.max_epochs:
            continue
        with torch.no_grad():
            users, items = _coo_forward(model, adjacency)
            recall = lg.recall_at_k((users @ items.T).numpy(), graph.train, graph.test, config.k)
        history.append((epoch, recall))
        if recall > best[0]:
            best, waited = (recall, epoch, model.embedding.weight.detach().clone()), 0
        else:
            waited += 1
            if waited >= config.patience:
                break
    with torch.no_grad():
        model.embedding.weight.copy_(best[2])
        users, items = (t.numpy() for t in _coo_forward(model, adjacency))
    return lg.LightGCNResult(
        Embeddings(graph.user_ids, users),
        Embeddings(graph.item_ids, items),
        best[0],
        best[1],
        history,
        time.perf_counter() - started,
        epochs=epoch,
        epoch_seconds=epoch_time / epoch,
    )


def _coo_forward(model, adjacency):
    """The earlier ``LightGCN.forward``: ``adjacency @ layer`` with autograd's own backward."""
    layer = total = model.embedding.weight
    for _ in range(model.num_layers):
        layer = adjacency @ layer
        total = total + layer
    final = total / (model.num_layers + 1)
    return final[: model.num_users], final[model.num_users :]


def _per_batch_epoch(model, adjacency, train, optimizer, config, generator) -> float:
    """The earlier epoch: a propagation and an optimizer step per mini-batch."""
    import torch

    from router.lightgcn import bpr_loss

    order = torch.randperm(len(train), generator=generator)
    negatives = torch.randint(model.num_items, (len(train),), generator=generator)
    total = 0.0
    for start in range(0, len(train), config.batch_size):
        batch = order[start : start + config.batch_size]
        u, p, n = train[batch, 0], train[batch, 1], negatives[batch]
        user_final, item_final = _coo_forward(model, adjacency)
        loss = bpr_loss(user_final[u], item_final[p], item_final[n])
        layer0 = model.embedding.weight
        reg = (
            layer0[u].pow(2).sum() + layer0[p + model.num_users].pow(2).sum() + layer0[n + model.num_users].pow(2).sum()
        ) / (2 * len(batch))
        optimizer.zero_grad()
        (loss + config.weight_decay * reg).backward()
        optimizer.step()
        total += float(loss.detach()) * len(batch)
    return total / len(train)


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _train_row(name: str, data: str, seed: int, overrides: dict, warm_share: float, threads: int) -> Row:
    """One row, in its own process: load the data, train, measure."""
    import polars as pl
    import torch

    import router.lightgcn as lg
    from pipelines.config import DatasetConfig
    from pipelines.data.load import load_dataset

    torch.set_num_threads(threads)
    interactions = load_dataset(DatasetConfig(format="movielens", path=data)).interactions
    config = lg.LightGCNConfig(seed=seed, progress=False, **overrides)
    init = None
    if name == "warm":
        cut = interactions["timestamp"].quantile(1 - warm_share)
        init = lg.train_lightgcn(interactions.filter(pl.col("timestamp") <= cut), config)
    before = _rss_mib()
    if name.startswith("per-batch"):
        result = train_per_batch(interactions, config)
    else:
        result = lg.train_lightgcn(interactions, config, init=init)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Row(
        name,
        result.epochs,
        result.best_epoch,
        result.epoch_seconds,
        result.train_seconds,
        peak,
        max(peak - before, 0.0),
        result.best_recall,
        vectors={"users": result.users, "items": result.items},
    )


def _agreement(rows: list[Row], n_clusters: int) -> None:
    """ARI of each row's K-means groups with the first row's, over the ids both embed."""
    from sklearn.metrics import adjusted_rand_score

    from router.groups import collaborative_groups

    def groups(row: Row, kind: str, ids: list[str]) -> list[str]:
        frame = collaborative_groups(row.vectors[kind].subset(ids), n_clusters=n_clusters, seed=0)
        return frame["group_id"].to_list()

    base = rows[0]
    for row in rows:
        for kind in ("users", "items"):
            ids = sorted(set(base.vectors[kind].ids) & set(row.vectors[kind].ids))
            ari = adjusted_rand_score(groups(base, kind, ids), groups(row, kind, ids))
            setattr(row, f"ari_{kind}", float(ari))


def run_lightgcn_bench(
    out: Path,
    data: Path,
    seed: int = 0,
    n_clusters: int = 8,
    warm_share: float = 0.1,
    threads: int = 1,
    overrides: dict | None = None,
) -> dict:
    """Train every row (``threads`` torch threads each), print a table, write ``out`` (JSON); returns it."""
    overrides = overrides or {}
    names = [("per-batch", seed), ("per-batch, seed+1", seed + 1), ("linear", seed), ("warm", seed)]
    context = multiprocessing.get_context("spawn")
    load = os.getloadavg()[0]
    rows = []
    for name, row_seed in names:
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as executor:
            rows.append(executor.submit(_train_row, name, str(data), row_seed, overrides, warm_share, threads).result())
    _agreement(rows, n_clusters)
    today, linear = rows[0], rows[2]
    results: dict[str, Any] = {
        "dataset": str(data),
        "seed": seed,
        "n_clusters": n_clusters,
        "warm_share": warm_share,
        "overrides": overrides,
        "threads": threads,
        "cpus": os.cpu_count(),
        "load_average": [load, os.getloadavg()[0]],
        "rows": [{k: v for k, v in asdict(r).items() if k != "vectors"} for r in rows],
        "recall_ratio": linear.recall_at_20 / today.recall_at_20 if today.recall_at_20 else None,
        "epoch_speedup": today.epoch_s / linear.epoch_s if linear.epoch_s else None,
    }
    results["recall_within_5pct"] = bool(results["recall_ratio"] and results["recall_ratio"] >= 1 - RECALL_TOLERANCE)
    from benchmarks.report import save_report

    save_report(results, Path(out))
    _print(results)
    return results


def _print(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"LightGCN on {results['dataset']}: per-batch propagation vs linear "
        f"({results['threads']} thread(s), load average {results['load_average'][0]:.1f})"
    )
    for name in (
        "training",
        "epochs",
        "best epoch",
        "s / epoch",
        "s total",
        "peak RSS MiB",
        "training MiB",
        "recall@20",
        "ARI users",
        "ARI items",
    ):
        table.add_column(name, justify="right")
    for r in results["rows"]:
        table.add_row(
            r["name"],
            str(r["epochs"]),
            str(r["best_epoch"]),
            f"{r['epoch_s']:.3f}",
            f"{r['train_s']:.1f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{r['train_rss_mib']:.0f}",
            f"{r['recall_at_20']:.4f}",
            f"{r['ari_users']:.3f}",
            f"{r['ari_items']:.3f}",
        )
    console = Console(width=150)
    console.print(table)
    console.print(
        f"recall@20 linear / per-batch = {results['recall_ratio']:.3f} "
        f"(target >= {1 - RECALL_TOLERANCE:.2f}); epoch speed-up {results['epoch_speedup']:.1f}x"
    )
