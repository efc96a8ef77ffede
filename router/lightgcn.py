"""LightGCN (He et al., 2020) in torch: user and item embeddings with collaborative signal.

Propagation over the symmetric-normalised user-item graph ``A_hat = D^-1/2 A D^-1/2`` (a torch sparse
matrix): ``E^(l+1) = A_hat E^(l)``; the final embedding is the mean of layers ``0..L`` (the propagated
output, not the layer-0 ids). Trained with BPR on positive interactions (``positive_column`` >=
``positive_threshold``: rating >= 4 by default; implicit feedback: weight > 0, or weight >= a threshold),
one uniformly sampled negative item per positive, Adam, early stopping on recall@k of a per-user
held-out share of the positives. The best-scoring epoch's embeddings are returned.

Cost: an epoch is ``propagations_per_epoch`` optimizer steps, each one full-graph propagation (forward and
backward, ``O(L * nnz * d)``) over an equal share of the positives, whose BPR loss is summed in chunks of
``batch_size`` triples; so an epoch is linear in the positives and its memory is the graph's plus a chunk's.
Early stopping scores a seeded sample of at most ``eval_users`` users, ``eval_chunk`` users x all items at
a time. ``train_lightgcn(..., init=...)`` starts from an earlier run's layer-0 embeddings (matched by id)
and trains ``warm_epochs`` epochs.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from router.embeddings import Embeddings, load_embeddings, save_embeddings

log = logging.getLogger(__name__)


@dataclass
class LightGCNConfig:
    """Training settings (defaults follow the LASER authors' setup where they gave one)."""

    embedding_dim: int = 32
    num_layers: int = 3
    positive_threshold: float | None = 4.0  # positive_column >= this is a positive interaction; None: > 0
    positive_column: str = "rating"  # "weight" for implicit feedback
    lr: float = 1e-2
    weight_decay: float = 1e-4  # L2 on the layer-0 embeddings of the step's triples (BPR regulariser)
    propagations_per_epoch: int = 4  # optimizer steps an epoch, each one full-graph propagation
    batch_size: int = 4096  # BPR triples scored at once within a step (memory, not the step size)
    max_epochs: int = 300
    warm_epochs: int = 30  # most epochs of a warm start (``init``); 0: always train from scratch
    eval_every: int = 2  # epochs between recall@k evaluations (sampled users, chunked: cheap)
    patience: int = 12  # epochs past the best evaluation before stopping
    holdout_fraction: float = 0.2  # share of each user's positives held out for early stopping
    k: int = 20
    eval_users: int = 2000  # users (with held-out positives) sampled, seeded, for recall@k
    eval_chunk: int = 256  # users scored at once against every item (fewer for large catalogues)
    seed: int = 0
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("propagations_per_epoch", "batch_size", "max_epochs", "eval_every", "eval_users", "eval_chunk"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"LightGCNConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.warm_epochs < 0:
            raise ValueError(f"LightGCNConfig.warm_epochs must be >= 0, got {self.warm_epochs}")


@dataclass(frozen=True)
class WarmStart:
    """Layer-0 embeddings (the model's parameters) of an earlier run, to start the next one from.

    Saved as two Parquet files (``users.parquet``, ``items.parquet``: columns ``id``, ``embedding``).
    """

    users: Embeddings
    items: Embeddings

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_embeddings(self.users, directory / "users.parquet")
        save_embeddings(self.items, directory / "items.parquet")

    @classmethod
    def load(cls, directory: str | Path) -> WarmStart | None:
        """The warm start saved in ``directory``; None when there is none or it cannot be read (logged)."""
        directory = Path(directory)
        if not (directory / "users.parquet").exists() or not (directory / "items.parquet").exists():
            return None
        try:
            return cls(load_embeddings(directory / "users.parquet"), load_embeddings(directory / "items.parquet"))
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            log.warning("LightGCN warm start in %s unreadable (%s); training from scratch", directory, exc)
            return None


@dataclass
class LightGCNResult:
    """Trained embeddings plus the early-stopping trace ``history`` = [(epoch, recall@k), ...].

    ``layer0`` holds the best epoch's parameters (pass the result as ``init`` to warm-start the next run);
    ``epochs`` the epochs trained and ``epoch_seconds`` their mean time without evaluation.
    """

    users: Embeddings
    items: Embeddings
    best_recall: float
    best_epoch: int
    history: list[tuple[int, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    layer0: WarmStart | None = None
    epochs: int = 0
    epoch_seconds: float = 0.0
    warm_started: bool = False


@dataclass
class InteractionGraph:
    """Positive interactions as integer indices, split into train and held-out parts."""

    user_ids: list[str]
    item_ids: list[str]
    train: np.ndarray  # [n_train, 2] (user index, item index)
    test: np.ndarray  # [n_test, 2]

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


def positive(value: pl.Expr, threshold: float | None) -> pl.Expr:
    """Whether an interaction is positive: ``value >= threshold``, or ``value > 0`` without a threshold."""
    return value > 0 if threshold is None else value >= threshold


def build_graph(
    interactions: pl.DataFrame,
    positive_threshold: float | None,
    holdout_fraction: float,
    seed: int,
    known_users: list[str] | None = None,
    known_items: list[str] | None = None,
    positive_column: str = "rating",
) -> InteractionGraph:
    """Index the positive interactions and hold out ``holdout_fraction`` of each user's positives.

    Positives: ``positive_column`` >= ``positive_threshold`` (None: > 0). Nodes are the users/items with at
    least one positive. A user keeps at least one training positive; users with a single positive are never
    held out. Unknown ids (when ``known_*`` are given) are an error.
    """
    for column in ("user_id", "item_id", positive_column):
        if column not in interactions.columns:
            raise ValueError(f"interactions have no column {column!r} (columns: {interactions.columns})")
    _check_known(interactions, "user_id", known_users)
    _check_known(interactions, "item_id", known_items)
    positives = (
        interactions.filter(positive(pl.col(positive_column), positive_threshold))
        .select(pl.col("user_id").cast(pl.Utf8), pl.col("item_id").cast(pl.Utf8))
        .unique()
        .sort("user_id", "item_id")
    )
    if positives.is_empty():
        rule = f">= {positive_threshold}" if positive_threshold is not None else "> 0"
        raise ValueError(f"no interaction has {positive_column} {rule}: nothing to train on")
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


class _Propagate(torch.autograd.Function):
    """``A_hat @ x`` for a symmetric sparse ``A_hat``: the backward is ``A_hat @ grad`` (no transpose built)."""

    @staticmethod
    def forward(ctx: Any, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.adjacency = adjacency
        return adjacency @ x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, ctx.adjacency @ grad


def sparse_csr(adjacency: torch.Tensor) -> torch.Tensor:
    """``adjacency`` in CSR, the faster layout for ``A @ X`` (torch calls its CSR support beta)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        return adjacency.to_sparse_csr()


class LightGCN(nn.Module):
    """Layer-0 embeddings for ``num_users + num_items`` nodes, propagated ``num_layers`` times."""

    def __init__(self, num_users: int, num_items: int, embedding_dim: int = 32, num_layers: int = 3) -> None:
        super().__init__()
        self.num_users, self.num_items, self.num_layers = num_users, num_items, num_layers
        self.embedding = nn.Embedding(num_users + num_items, embedding_dim)
        nn.init.normal_(self.embedding.weight, std=0.1)

    def forward(self, adjacency: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final (mean over layers 0..L) user ``[U, d]`` and item ``[I, d]`` embeddings.

        ``adjacency`` is the symmetric sparse ``A_hat`` (COO or CSR) of :func:`normalized_adjacency`.
        """
        layer = self.embedding.weight
        total = layer
        for _ in range(self.num_layers):
            layer = _Propagate.apply(adjacency, layer)  # type: ignore[no-untyped-call]  # torch leaves apply untyped
            total = total + layer
        final = total / (self.num_layers + 1)
        return final[: self.num_users], final[self.num_users :]


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


def _train_step(model: LightGCN, adjacency: torch.Tensor, triples: torch.Tensor, config: LightGCNConfig) -> float:
    """One optimizer step's gradient on ``triples`` [n, 3] (user, positive, negative): one propagation.

    The BPR loss (mean over the triples) and the L2 term are computed in chunks of ``batch_size`` triples
    on copies of the rows they touch; their gradients are added into full-size buffers (``O(chunk)`` a
    chunk, so the step stays linear) and flow back through the propagation once. Returns the summed loss.
    """
    user_final, item_final = model(adjacency)
    users, items, layer0 = user_final.detach(), item_final.detach(), model.embedding.weight.detach()
    grad_users, grad_items, grad_layer0 = torch.zeros_like(users), torch.zeros_like(items), torch.zeros_like(layer0)
    n, total = len(triples), 0.0
    for chunk in triples.split(config.batch_size):
        u, p, q = chunk.T
        nodes = torch.cat([u, p + model.num_users, q + model.num_users])
        rows = [
            users[u].requires_grad_(),
            items[p].requires_grad_(),
            items[q].requires_grad_(),
            layer0[nodes].requires_grad_(),
        ]
        loss = bpr_loss(*rows[:3]) * (len(chunk) / n)
        (loss + config.weight_decay * rows[3].pow(2).sum() / (2 * n)).backward()
        grad_users.index_add_(0, u, rows[0].grad)
        grad_items.index_add_(0, p, rows[1].grad).index_add_(0, q, rows[2].grad)
        grad_layer0.index_add_(0, nodes, rows[3].grad)
        total += float(loss.detach()) * n
    torch.autograd.backward([user_final, item_final], [grad_users, grad_items])
    weight_grad = model.embedding.weight.grad
    if weight_grad is None:
        raise RuntimeError("the LightGCN backward left no gradient on the embedding table")
    weight_grad.add_(grad_layer0)
    return total


def _train_epoch(
    model: LightGCN,
    adjacency: torch.Tensor,
    train: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    config: LightGCNConfig,
    generator: torch.Generator,
) -> float:
    """Every training positive once, with a fresh negative, in ``propagations_per_epoch`` steps; mean loss."""
    order = torch.randperm(len(train), generator=generator, device="cpu").to(train.device)
    negatives = torch.randint(model.num_items, (len(train),), generator=generator, device="cpu").to(train.device)
    triples = torch.cat([train, negatives[:, None]], dim=1)
    total = 0.0
    for step in order.tensor_split(min(config.propagations_per_epoch, len(train))):
        optimizer.zero_grad()
        total += _train_step(model, adjacency, triples[step], config)
        optimizer.step()
    return total / len(train)


WARM_MIN_KNOWN = 0.5  # a warm start needs at least this share of the graph's nodes known to it


def _warm_start(model: LightGCN, graph: InteractionGraph, init: WarmStart, dim: int) -> bool:
    """Copy ``init``'s vectors into the rows of the ids it knows; False (nothing copied, logged) when its
    width differs or it knows under ``WARM_MIN_KNOWN`` of the nodes."""
    if init.users.dim != dim or init.items.dim != dim:
        log.warning("LightGCN warm start has dimension %d, the config %d: training from scratch", init.users.dim, dim)
        return False
    rows, vectors = [], []
    for ids, start, offset in ((graph.user_ids, init.users, 0), (graph.item_ids, init.items, graph.num_users)):
        matched = pl.DataFrame({"id": ids, "row": np.arange(len(ids))}).join(
            pl.DataFrame({"id": start.ids, "at": np.arange(len(start))}), on="id"
        )
        rows.append(matched["row"].to_numpy() + offset)
        vectors.append(start.vectors[matched["at"].to_numpy()])
    known = sum(len(r) for r in rows)
    if known < WARM_MIN_KNOWN * (graph.num_users + graph.num_items):
        log.warning(
            "LightGCN warm start knows %d of %d users and items: training from scratch",
            known,
            graph.num_users + graph.num_items,
        )
        return False
    with torch.no_grad():
        weight = model.embedding.weight
        weight[torch.as_tensor(np.concatenate(rows), dtype=torch.long, device=weight.device)] = torch.as_tensor(
            np.concatenate(vectors), device=weight.device
        )
    log.info(
        "LightGCN warm start: %d of %d users and items start from the last run",
        known,
        graph.num_users + graph.num_items,
    )
    return True


def train_lightgcn(
    interactions: pl.DataFrame,
    config: LightGCNConfig | None = None,
    known_users: list[str] | None = None,
    known_items: list[str] | None = None,
    init: LightGCNResult | WarmStart | None = None,
) -> LightGCNResult:
    """Train LightGCN on canonical ``interactions`` (user_id, item_id, rating, ...) and return embeddings.

    Only users/items with at least one positive interaction get an embedding. With ``init`` (an earlier
    result or its ``layer0``) and ``warm_epochs`` > 0, the ids it knows start from its vectors, new ids as
    a cold start would, and training runs at most ``warm_epochs`` epochs (unless it knows under half the
    nodes, or has another width: then from scratch). Deterministic for a seed on CPU.
    """
    config = config or LightGCNConfig()
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    device = _resolve_device(config.device)
    graph = build_graph(
        interactions,
        config.positive_threshold,
        config.holdout_fraction,
        config.seed,
        known_users,
        known_items,
        config.positive_column,
    )
    adjacency = sparse_csr(normalized_adjacency(graph.train, graph.num_users, graph.num_items)).to(device)
    model = LightGCN(graph.num_users, graph.num_items, config.embedding_dim, config.num_layers).to(device)
    init = init.layer0 if isinstance(init, LightGCNResult) else init
    warm = init is not None and config.warm_epochs > 0 and _warm_start(model, graph, init, config.embedding_dim)
    max_epochs = config.warm_epochs if warm else config.max_epochs
    train = torch.as_tensor(graph.train, dtype=torch.long, device=device)
    fit = _fit(model, adjacency, train, eval_sample(graph, config.eval_users, config.seed), config, max_epochs)
    return _result(model, adjacency, graph, fit, started, warm)


@dataclass
class _Fit:
    """A training run's early-stopping bookkeeping: the best evaluation so far and the trace."""

    best_recall: float
    best_epoch: int
    best_weight: torch.Tensor  # layer-0 embeddings of the best epoch
    history: list[tuple[int, float]] = field(default_factory=list)
    epochs: int = 0  # epochs trained
    epoch_time: float = 0.0  # seconds in training epochs (evaluation excluded)


def _fit(
    model: LightGCN,
    adjacency: torch.Tensor,
    train: torch.Tensor,
    sample: EvalSample,
    config: LightGCNConfig,
    max_epochs: int,
) -> _Fit:
    """Train up to ``max_epochs`` epochs, evaluating every ``eval_every`` (and the last), until early stop."""
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    fit = _Fit(-1.0, 0, model.embedding.weight.detach().clone())
    bar = tqdm(range(1, max_epochs + 1), desc="LightGCN", disable=not config.progress, leave=False)
    for epoch in bar:
        fit.epochs = epoch
        model.train()
        tick = time.perf_counter()
        loss = _train_epoch(model, adjacency, train, optimizer, config, generator)
        fit.epoch_time += time.perf_counter() - tick
        if epoch % config.eval_every and epoch != max_epochs:
            continue
        recall = _evaluate(model, adjacency, sample, config)
        bar.set_postfix(loss=f"{loss:.4f}", recall=f"{recall:.4f}")
        if _record(fit, model, epoch, recall, config):
            break
    bar.close()
    return fit


def _record(fit: _Fit, model: LightGCN, epoch: int, recall: float, config: LightGCNConfig) -> bool:
    """Add an evaluation to ``fit``, keeping the best epoch's weights; True when patience has run out."""
    fit.history.append((epoch, recall))
    if recall > fit.best_recall:
        fit.best_recall, fit.best_epoch, fit.best_weight = recall, epoch, model.embedding.weight.detach().clone()
    elif epoch - fit.best_epoch >= config.patience:
        log.info(
            "LightGCN early stop at epoch %d (best recall@%d %.4f at epoch %d)",
            epoch,
            config.k,
            fit.best_recall,
            fit.best_epoch,
        )
        return True
    return False


def _result(
    model: LightGCN, adjacency: torch.Tensor, graph: InteractionGraph, fit: _Fit, started: float, warm: bool
) -> LightGCNResult:
    """The best epoch's final embeddings and layer-0 warm start, with the training trace."""
    with torch.no_grad():
        model.embedding.weight.copy_(fit.best_weight)
        user_final, item_final = (t.cpu().numpy() for t in model(adjacency))
    layer0 = fit.best_weight.cpu().numpy()
    start = WarmStart(
        Embeddings(graph.user_ids, layer0[: graph.num_users]), Embeddings(graph.item_ids, layer0[graph.num_users :])
    )
    return LightGCNResult(
        Embeddings(graph.user_ids, user_final),
        Embeddings(graph.item_ids, item_final),
        best_recall=fit.best_recall,
        best_epoch=fit.best_epoch,
        history=fit.history,
        train_seconds=time.perf_counter() - started,
        layer0=start,
        epochs=fit.epochs,
        epoch_seconds=fit.epoch_time / max(fit.epochs, 1),
        warm_started=warm,
    )


@dataclass
class EvalSample:
    """The users recall@k is measured on, and their train/held-out positives as (sample row, item) pairs
    sorted by row (so a chunk of users is a slice)."""

    users: np.ndarray  # [S] user indices
    train: np.ndarray  # [n, 2] (row in ``users``, item index)
    test: np.ndarray  # [m, 2]


def eval_sample(graph: InteractionGraph, max_users: int, seed: int) -> EvalSample:
    """A seeded sample of at most ``max_users`` of the users with held-out positives."""
    users = np.unique(graph.test[:, 0]) if len(graph.test) else np.zeros(0, dtype=np.int64)
    if len(users) > max_users:
        users = np.sort(np.random.default_rng(seed).choice(users, max_users, replace=False))
    row = np.full(graph.num_users, -1, dtype=np.int64)
    row[users] = np.arange(len(users))

    def pick(pairs: np.ndarray) -> np.ndarray:
        rows = row[pairs[:, 0]]
        keep = rows >= 0
        picked = np.column_stack([rows[keep], pairs[keep, 1]])
        return picked[np.argsort(picked[:, 0], kind="stable")]

    return EvalSample(users, pick(graph.train), pick(graph.test))


_EVAL_SCORES = 1 << 24  # most scores (chunk users x items) held at once: 64 MiB of float32


def _chunk_scores(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Scores ``[chunk, I]`` of a chunk of users against every item (a seam for tests)."""
    return users @ items.T


def chunked_recall(users: torch.Tensor, items: torch.Tensor, sample: EvalSample, k: int, chunk: int) -> float:
    """Recall@k (as :func:`recall_at_k`) over ``sample``'s users, scoring ``chunk`` users at a time."""
    if len(sample.users) == 0:
        return 0.0
    chunk = max(1, min(chunk, _EVAL_SCORES // max(items.shape[0], 1)))
    k = min(k, items.shape[0])
    train_rows, test_rows = sample.train[:, 0], sample.test[:, 0]
    total = 0.0
    for lo in range(0, len(sample.users), chunk):
        hi = min(lo + chunk, len(sample.users))
        scores = _chunk_scores(users[torch.as_tensor(sample.users[lo:hi], device=users.device)], items)
        a, b = np.searchsorted(train_rows, [lo, hi])
        seen = torch.as_tensor(sample.train[a:b], device=scores.device)
        scores[seen[:, 0] - lo, seen[:, 1]] = -torch.inf
        top = scores.topk(k, dim=1).indices
        a, b = np.searchsorted(test_rows, [lo, hi])
        held = torch.as_tensor(sample.test[a:b], device=scores.device)
        hit = (top[held[:, 0] - lo] == held[:, 1:]).any(dim=1).double()
        rows = held[:, 0] - lo
        hits = torch.zeros(hi - lo, dtype=torch.float64, device=scores.device).index_add_(0, rows, hit)
        counts = torch.bincount(rows, minlength=hi - lo).double()
        total += float((hits / counts).sum())
    return total / len(sample.users)


@torch.no_grad()
def _evaluate(model: LightGCN, adjacency: torch.Tensor, sample: EvalSample, config: LightGCNConfig) -> float:
    model.eval()
    users, items = model(adjacency)
    return chunked_recall(users, items, sample, config.k, config.eval_chunk)
