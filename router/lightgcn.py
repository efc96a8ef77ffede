"""LightGCN (He et al., 2020) in torch: user and item embeddings with collaborative signal.

Propagation over the symmetric-normalised user-item graph ``A_hat = D^-1/2 A D^-1/2``:
``E^(l+1) = A_hat E^(l)``; the final embedding is the mean of layers ``0..L`` (the propagated output,
not the layer-0 ids). Trained with BPR on positive interactions (rating >= ``positive_threshold``),
one uniformly sampled negative item per positive, Adam, early stopping on recall@k of a per-user
held-out share of the positives. The best-scoring epoch's embeddings are returned.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from router.embeddings import Embeddings

log = logging.getLogger(__name__)


@dataclass
class LightGCNConfig:
    """Training settings (defaults follow the LASER authors' setup where they gave one)."""

    embedding_dim: int = 32
    num_layers: int = 3
    positive_threshold: float = 4.0   # rating >= this is a positive interaction
    lr: float = 1e-2
    weight_decay: float = 1e-4        # L2 on the layer-0 embeddings of the batch (BPR regulariser)
    batch_size: int = 4096
    max_epochs: int = 300
    eval_every: int = 5               # epochs between recall@k evaluations
    patience: int = 4                 # evaluations without improvement before stopping
    holdout_fraction: float = 0.2     # share of each user's positives held out for early stopping
    k: int = 20
    seed: int = 0
    device: str = "cpu"               # "cpu", "cuda" or "auto"
    progress: bool = True


@dataclass
class LightGCNResult:
    """Trained embeddings plus the early-stopping trace ``history`` = [(epoch, recall@k), ...]."""

    users: Embeddings
    items: Embeddings
    best_recall: float
    best_epoch: int
    history: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0


@dataclass
class InteractionGraph:
    """Positive interactions as integer indices, split into train and held-out parts."""

    user_ids: list[str]
    item_ids: list[str]
    train: np.ndarray  # [n_train, 2] (user index, item index)
    test: np.ndarray   # [n_test, 2]

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)


def _check_known(frame: pl.DataFrame, column: str, known: list[str] | None) -> None:
    if known is None:
        return
    unknown = frame.select(pl.col(column).unique()).filter(~pl.col(column).is_in(known))[column].sort().to_list()
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else "")
        raise ValueError(f"interactions name unknown {column}s: {shown}")


def build_graph(interactions: pl.DataFrame, positive_threshold: float, holdout_fraction: float, seed: int,
                known_users: list[str] | None = None, known_items: list[str] | None = None) -> InteractionGraph:
    """Index the positive interactions and hold out ``holdout_fraction`` of each user's positives.

    Nodes are the users/items with at least one positive. A user keeps at least one training positive;
    users with a single positive are never held out. Unknown ids (when ``known_*`` are given) are an error.
    """
    for column in ("user_id", "item_id", "rating"):
        if column not in interactions.columns:
            raise ValueError(f"interactions have no column {column!r} (columns: {interactions.columns})")
    _check_known(interactions, "user_id", known_users)
    _check_known(interactions, "item_id", known_items)
    positives = (interactions.filter(pl.col("rating") >= positive_threshold)
                 .select(pl.col("user_id").cast(pl.Utf8), pl.col("item_id").cast(pl.Utf8)).unique()
                 .sort("user_id", "item_id"))
    if positives.is_empty():
        raise ValueError(f"no interaction has rating >= {positive_threshold}: nothing to train on")
    user_ids = positives["user_id"].unique().sort().to_list()
    item_ids = positives["item_id"].unique().sort().to_list()
    rng = np.random.default_rng(seed)
    positives = positives.with_columns(
        u=pl.col("user_id").replace_strict(user_ids, list(range(len(user_ids))), return_dtype=pl.Int64),
        i=pl.col("item_id").replace_strict(item_ids, list(range(len(item_ids))), return_dtype=pl.Int64),
        r=pl.Series(rng.random(len(positives))),
    ).with_columns(rank=pl.col("r").rank("ordinal").over("u"), n=pl.len().over("u"))
    n_test = (pl.col("n") * holdout_fraction).floor().clip(upper_bound=pl.col("n") - 1)
    held = positives.filter(pl.col("rank") <= n_test)
    kept = positives.filter(pl.col("rank") > n_test)
    return InteractionGraph(user_ids, item_ids, kept.select("u", "i").to_numpy(), held.select("u", "i").to_numpy())


def normalized_adjacency(train: np.ndarray, num_users: int, num_items: int) -> torch.Tensor:
    """Sparse ``D^-1/2 A D^-1/2`` of the bipartite graph; users are rows 0..U-1, items U..U+I-1."""
    users = torch.as_tensor(train[:, 0], dtype=torch.long)
    items = torch.as_tensor(train[:, 1], dtype=torch.long) + num_users
    rows = torch.cat([users, items])
    cols = torch.cat([items, users])
    n = num_users + num_items
    degree = torch.bincount(rows, minlength=n).float()
    inv_sqrt = degree.pow(-0.5)
    inv_sqrt[torch.isinf(inv_sqrt)] = 0.0
    values = inv_sqrt[rows] * inv_sqrt[cols]
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (n, n), check_invariants=False).coalesce()


class LightGCN(nn.Module):
    """Layer-0 embeddings for ``num_users + num_items`` nodes, propagated ``num_layers`` times."""

    def __init__(self, num_users: int, num_items: int, embedding_dim: int = 32, num_layers: int = 3) -> None:
        super().__init__()
        self.num_users, self.num_items, self.num_layers = num_users, num_items, num_layers
        self.embedding = nn.Embedding(num_users + num_items, embedding_dim)
        nn.init.normal_(self.embedding.weight, std=0.1)

    def forward(self, adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final (mean over layers 0..L) user ``[U, d]`` and item ``[I, d]`` embeddings."""
        layer = self.embedding.weight
        total = layer
        for _ in range(self.num_layers):
            layer = adjacency @ layer
            total = total + layer
        final = total / (self.num_layers + 1)
        return final[: self.num_users], final[self.num_users:]


def bpr_loss(users: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """Mean ``-log sigmoid(u.p - u.n)`` over a batch of ``[B, d]`` embeddings."""
    margin = (users * positives).sum(-1) - (users * negatives).sum(-1)
    return nn.functional.softplus(-margin).mean()


def recall_at_k(scores: np.ndarray, train: np.ndarray, test: np.ndarray, k: int = 20) -> float:
    """Mean over users with held-out items of ``|top-k ∩ held-out| / |held-out|``.

    ``scores`` is ``[U, I]``; training positives are excluded from each user's top-k.
    """
    if len(test) == 0:
        return 0.0
    scores = np.array(scores, dtype=np.float64, copy=True)
    scores[train[:, 0], train[:, 1]] = -np.inf
    k = min(k, scores.shape[1])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    hit = np.zeros_like(scores, dtype=bool)
    np.put_along_axis(hit, top, True, axis=1)
    hits = np.bincount(test[:, 0], weights=hit[test[:, 0], test[:, 1]], minlength=scores.shape[0])
    held = np.bincount(test[:, 0], minlength=scores.shape[0])
    users = held > 0
    return float(np.mean(hits[users] / held[users]))


def popularity_scores(train: np.ndarray, num_users: int, num_items: int) -> np.ndarray:
    """The baseline: every user scores an item by its number of training positives, ``[U, I]``."""
    counts = np.bincount(train[:, 1], minlength=num_items).astype(np.float64)
    return np.broadcast_to(counts, (num_users, num_items))


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _train_epoch(model: LightGCN, adjacency: torch.Tensor, train: torch.Tensor, optimizer: torch.optim.Optimizer,
                 config: LightGCNConfig, generator: torch.Generator) -> float:
    order = torch.randperm(len(train), generator=generator, device="cpu").to(train.device)
    negatives_all = torch.randint(model.num_items, (len(train),), generator=generator, device="cpu").to(train.device)
    total = 0.0
    for start in range(0, len(train), config.batch_size):
        batch = order[start:start + config.batch_size]
        u, p, n = train[batch, 0], train[batch, 1], negatives_all[batch]
        user_final, item_final = model(adjacency)
        loss = bpr_loss(user_final[u], item_final[p], item_final[n])
        layer0 = model.embedding.weight
        reg = (layer0[u].pow(2).sum() + layer0[p + model.num_users].pow(2).sum()
               + layer0[n + model.num_users].pow(2).sum()) / (2 * len(batch))
        optimizer.zero_grad()
        (loss + config.weight_decay * reg).backward()
        optimizer.step()
        total += float(loss.detach()) * len(batch)
    return total / len(train)


def train_lightgcn(interactions: pl.DataFrame, config: LightGCNConfig | None = None,
                   known_users: list[str] | None = None, known_items: list[str] | None = None) -> LightGCNResult:
    """Train LightGCN on canonical ``interactions`` (user_id, item_id, rating, ...) and return embeddings.

    Only users/items with at least one positive interaction get an embedding. Deterministic for a seed
    on CPU.
    """
    config = config or LightGCNConfig()
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    device = _resolve_device(config.device)
    graph = build_graph(interactions, config.positive_threshold, config.holdout_fraction, config.seed,
                        known_users, known_items)
    adjacency = normalized_adjacency(graph.train, graph.num_users, graph.num_items).to(device)
    model = LightGCN(graph.num_users, graph.num_items, config.embedding_dim, config.num_layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    train = torch.as_tensor(graph.train, dtype=torch.long, device=device)
    generator = torch.Generator().manual_seed(config.seed)
    best = (-1.0, 0, model.embedding.weight.detach().clone())
    history: list[tuple[int, float]] = []
    waited = 0
    bar = tqdm(range(1, config.max_epochs + 1), desc="LightGCN", disable=not config.progress, leave=False)
    for epoch in bar:
        model.train()
        loss = _train_epoch(model, adjacency, train, optimizer, config, generator)
        if epoch % config.eval_every and epoch != config.max_epochs:
            continue
        recall = _evaluate(model, adjacency, graph, config.k)
        history.append((epoch, recall))
        bar.set_postfix(loss=f"{loss:.4f}", recall=f"{recall:.4f}")
        if recall > best[0]:
            best, waited = (recall, epoch, model.embedding.weight.detach().clone()), 0
        else:
            waited += 1
            if waited >= config.patience:
                log.info("LightGCN early stop at epoch %d (best recall@%d %.4f at epoch %d)",
                         epoch, config.k, best[0], best[1])
                break
    bar.close()
    with torch.no_grad():
        model.embedding.weight.copy_(best[2])
        user_final, item_final = (t.cpu().numpy() for t in model(adjacency))
    return LightGCNResult(Embeddings(graph.user_ids, user_final), Embeddings(graph.item_ids, item_final),
                          best_recall=best[0], best_epoch=best[1], history=history,
                          train_seconds=time.perf_counter() - started)


@torch.no_grad()
def _evaluate(model: LightGCN, adjacency: torch.Tensor, graph: InteractionGraph, k: int) -> float:
    model.eval()
    users, items = model(adjacency)
    return recall_at_k((users @ items.T).cpu().numpy(), graph.train, graph.test, k)
