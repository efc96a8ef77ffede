"""Downstream CTR check: samples from new histories, DIN and DCNv2 with knowledge vectors, source comparison."""

from pipelines.ctr.compare import NO_KNOWLEDGE, RunResult, compare_sources, summarise, train_and_test
from pipelines.ctr.features import CtrTensors, ItemCatalog, KnowledgeVectors, to_tensors
from pipelines.ctr.models import DCNv2, DIN, MODEL_LABELS, MODELS, ModelConfig, MoEConverter, build_model
from pipelines.ctr.samples import build_samples, split_by_user
from pipelines.ctr.train import FitResult, TrainConfig, evaluate, fit, metrics, predict, selection_loss

__all__ = [
    "NO_KNOWLEDGE",
    "RunResult",
    "compare_sources",
    "summarise",
    "train_and_test",
    "CtrTensors",
    "ItemCatalog",
    "KnowledgeVectors",
    "to_tensors",
    "DCNv2",
    "DIN",
    "MODEL_LABELS",
    "MODELS",
    "ModelConfig",
    "MoEConverter",
    "build_model",
    "build_samples",
    "split_by_user",
    "FitResult",
    "TrainConfig",
    "evaluate",
    "fit",
    "metrics",
    "predict",
    "selection_loss",
]
