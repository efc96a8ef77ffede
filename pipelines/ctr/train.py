"""Training with Adam, early stopping and model selection on the VALIDATION set; test metrics after.

:func:`fit` sees only the train and validation sets; the selection criterion
(:func:`selection_loss`) is computed on validation data only. The test set is scored once, by
:func:`evaluate`, on the model that validation chose.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import log_loss, roc_auc_score
from torch import nn

from pipelines.ctr.features import CtrTensors

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Training settings.

    Args:
        lr: Adam learning rate (default: 1e-3).
        weight_decay: Adam weight decay (default: 0.0).
        batch_size: samples per step (default: 256).
        max_epochs: upper bound on epochs (default: 20).
        patience: epochs without a better validation loss before stopping (default: 2).
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 256
    max_epochs: int = 20
    patience: int = 2


@dataclass
class FitResult:
    """What :func:`fit` chose: the best epoch (1-based) and the validation log loss after every epoch."""

    best_epoch: int
    val_history: list[float] = field(default_factory=list)

    @property
    def best_val_loss(self) -> float:
        return self.val_history[self.best_epoch - 1]


@torch.inference_mode()
def predict(model: nn.Module, data: CtrTensors, batch_size: int = 4096) -> np.ndarray:
    """Click probabilities ``[N]`` in sample order."""
    model.eval()
    out = [torch.sigmoid(model(batch)) for batch in data.batches(batch_size)]
    return torch.cat(out).double().numpy() if out else np.zeros(0)


def metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """AUC and log loss (scikit-learn). AUC is NaN when only one class is present."""
    labels = np.asarray(labels)
    auc = float(roc_auc_score(labels, probs)) if len(np.unique(labels)) == 2 else float("nan")
    return {"auc": auc, "logloss": float(log_loss(labels, probs, labels=[0, 1]))}


def selection_loss(model: nn.Module, val: CtrTensors) -> float:
    """The model-selection criterion: log loss on the validation set."""
    return metrics(val.label.numpy(), predict(model, val))["logloss"]


def fit(
    model: nn.Module, train: CtrTensors, val: CtrTensors, cfg: TrainConfig = TrainConfig(), seed: int = 0
) -> FitResult:
    """Train with Adam + BCE; keep the weights of the epoch with the lowest validation log loss.

    Stops after ``cfg.patience`` epochs without improvement. On return ``model`` holds the selected
    weights. Batch order is seeded with ``seed``.
    """
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f"fit needs non-empty train and validation sets (got {len(train)} and {len(val)} samples)")
    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(seed)
    loss_fn = nn.BCEWithLogitsLoss()
    result, best_state = FitResult(best_epoch=0), None
    for epoch in range(1, cfg.max_epochs + 1):
        model.train()
        for batch in train.batches(cfg.batch_size, generator):
            optimiser.zero_grad()
            loss_fn(model(batch), batch.label).backward()
            optimiser.step()
        val_loss = selection_loss(model, val)
        result.val_history.append(val_loss)
        log.debug("epoch %d: validation log loss %.4f", epoch, val_loss)
        if best_state is None or val_loss < result.best_val_loss:
            result.best_epoch, best_state = epoch, copy.deepcopy(model.state_dict())
        elif epoch - result.best_epoch >= cfg.patience:
            break
    if best_state is None:
        raise ValueError(f"max_epochs is {cfg.max_epochs}: no epoch ran, so there is no model to keep (need >= 1)")
    model.load_state_dict(best_state)
    return result


def evaluate(model: nn.Module, test: CtrTensors) -> dict[str, float]:
    """Test AUC and log loss of a trained model."""
    return metrics(test.label.numpy(), predict(model, test))
