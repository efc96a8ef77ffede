"""Compare knowledge sources on downstream CTR: every (source, model, seed) trained and tested alike.

For one seed every source shares the same user split, the same initial weights (same architecture,
same seed) and the same batch order, so AUC differences between sources come from the knowledge.
A source is "lossless vs <reference>" when, for every model, the seed-averaged paired AUC difference
to the reference source is within ``tolerance`` (0.002 by default, as the paper's Table 2 reads).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import math

import numpy as np
import polars as pl
import torch
from scipy import stats
from tqdm.auto import tqdm

from pipelines.ctr.config import NO_KNOWLEDGE
from pipelines.ctr.features import ItemCatalog, KnowledgeVectors, to_tensors
from pipelines.ctr.networks import ModelConfig, build_model
from pipelines.ctr.samples import split_by_user
from pipelines.ctr.train import TrainConfig, evaluate, fit

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """Test metrics of one trained model, with what validation selected."""

    source: str
    model: str
    seed: int
    auc: float
    logloss: float
    best_epoch: int
    val_logloss: float


def train_and_test(
    samples: dict[str, pl.DataFrame],
    catalog: ItemCatalog,
    knowledge: KnowledgeVectors | None,
    model_name: str,
    seed: int,
    model_cfg: ModelConfig = ModelConfig(),
    train_cfg: TrainConfig = TrainConfig(),
    history_len: int = 5,
) -> tuple[dict[str, float], int, float]:
    """Train ``model_name`` on ``samples['train']``, select on ``samples['val']``, score ``samples['test']``.

    Returns (test metrics, best epoch, best validation log loss).
    """
    train, val, test = (to_tensors(samples[k], catalog, knowledge, history_len) for k in ("train", "val", "test"))
    torch.manual_seed(seed)
    model = build_model(model_name, catalog, knowledge.dim if knowledge is not None else None, model_cfg)
    chosen = fit(model, train, val, train_cfg, seed=seed)
    return evaluate(model, test), chosen.best_epoch, chosen.best_val_loss


def compare_sources(
    samples: pl.DataFrame,
    catalog: ItemCatalog,
    sources: dict[str, KnowledgeVectors | None],
    models: tuple[str, ...] = ("din", "dcnv2"),
    seeds: tuple[int, ...] = (0, 1, 2),
    model_cfg: ModelConfig = ModelConfig(),
    train_cfg: TrainConfig = TrainConfig(),
    history_len: int = 5,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    progress: bool = True,
) -> list[RunResult]:
    """Train and test every model for every knowledge source (None = no knowledge inputs) and seed."""
    runs: list[RunResult] = []
    bar = tqdm(total=len(seeds) * len(sources) * len(models), desc="ctr-eval", unit="model", disable=not progress)
    for seed in seeds:
        parts = split_by_user(samples, seed, fractions)
        for source, knowledge in sources.items():
            for model_name in models:
                test, epoch, val_loss = train_and_test(
                    parts, catalog, knowledge, model_name, seed, model_cfg, train_cfg, history_len
                )
                runs.append(RunResult(source, model_name, seed, test["auc"], test["logloss"], epoch, val_loss))
                log.info(
                    "seed %d %s %s: test AUC %.4f LL %.4f (epoch %d)",
                    seed,
                    source,
                    model_name,
                    test["auc"],
                    test["logloss"],
                    epoch,
                )
                bar.update()
    bar.close()
    return runs


def mean_ci95(values) -> tuple[float, float]:
    """Student-t 95% interval of the mean of ``values`` (seeds as independent draws); NaNs are left out.

    One value (or none) gives ``(nan, nan)``: no spread, no interval. Equal values give a zero-width one.
    """
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size < 2:
        return float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    mean = float(x.mean())
    return mean - half, mean + half


def as_float(value: object, what: str) -> float:
    """A polars aggregate (``Series.mean``, ``std``) as a float; None (an empty or all-null column) is refused
    naming ``what``."""
    if not isinstance(value, (int, float)):
        raise ValueError(f"{what}: {value!r} is no number (an empty or all-null column)")
    return float(value)


def paired_deltas(frame: pl.DataFrame, source: str, baseline: str) -> dict[str, dict[str, float | list[float]]]:
    """Per model: mean of (source - baseline) test AUC and log loss over the seeds both ran, with 95% intervals."""
    base = frame.filter(pl.col("source") == baseline).select(
        "model", "seed", pl.col("auc").alias("base_auc"), pl.col("logloss").alias("base_logloss")
    )
    paired = frame.filter(pl.col("source") == source).join(base, on=["model", "seed"], how="inner")
    out: dict[str, dict[str, float | list[float]]] = {}
    for (model,), g in paired.group_by(["model"], maintain_order=True):
        d_auc = (g["auc"] - g["base_auc"]).to_list()
        d_ll = (g["logloss"] - g["base_logloss"]).to_list()
        out[model] = {
            "auc": float(np.nanmean(d_auc)),
            "auc_ci95": list(mean_ci95(d_auc)),
            "logloss": float(np.nanmean(d_ll)),
            "logloss_ci95": list(mean_ci95(d_ll)),
            "n": g.height,
        }
    return out


def summarise(runs: list[RunResult], reference: str = "greedy", tolerance: float = 0.002) -> dict:
    """Mean/std/95% interval of test AUC and log loss per (source, model), paired differences and the
    lossless verdicts vs ``reference``.

    Returns ``{"table": {source: {model: {auc_mean, auc_std, auc_ci95, logloss_mean, logloss_std,
    logloss_ci95, n}}}, "verdicts": {source: {"delta_auc": {model: mean paired delta}, "lossless": bool}},
    "deltas": {source: {"vs_none" | "vs_<reference>": {model: {auc, auc_ci95, logloss, logloss_ci95, n}}}},
    ...}``. Intervals are Student-t over the seeds (:func:`mean_ci95`); differences are paired by seed.
    Verdicts exist for every source except ``none`` and the reference, and only when the reference was run.
    """
    frame = pl.DataFrame([asdict(r) for r in runs])
    table: dict[str, dict[str, dict[str, float | list[float]]]] = {}
    for (source, model), group in frame.group_by(["source", "model"], maintain_order=True):
        what = f"{source}/{model}"
        table.setdefault(source, {})[model] = {
            "auc_mean": as_float(group["auc"].mean(), f"{what} auc"),
            "auc_std": as_float(group["auc"].std(ddof=0), f"{what} auc"),
            "auc_ci95": list(mean_ci95(group["auc"].to_list())),
            "logloss_mean": as_float(group["logloss"].mean(), f"{what} logloss"),
            "logloss_std": as_float(group["logloss"].std(ddof=0), f"{what} logloss"),
            "logloss_ci95": list(mean_ci95(group["logloss"].to_list())),
            "n": group.height,
        }
    differences: dict[str, dict[str, dict]] = {}
    for source in table:
        if source == NO_KNOWLEDGE:
            continue
        for baseline in (NO_KNOWLEDGE, reference):
            if baseline in table and baseline != source:
                differences.setdefault(source, {})[f"vs_{baseline}"] = paired_deltas(frame, source, baseline)
    verdicts: dict[str, dict] = {}
    if reference in table:
        ref = frame.filter(pl.col("source") == reference).select("model", "seed", pl.col("auc").alias("ref_auc"))
        for source in table:
            if source in (NO_KNOWLEDGE, reference):
                continue
            paired = frame.filter(pl.col("source") == source).join(ref, on=["model", "seed"], how="inner")
            deltas = {
                m: as_float((g["auc"] - g["ref_auc"]).mean(), f"{source}/{m} auc - {reference}")
                for (m,), g in paired.group_by(["model"], maintain_order=True)
            }
            lossless = (
                bool(deltas) and set(deltas) == set(table[source]) and all(abs(d) <= tolerance for d in deltas.values())
            )
            verdicts[source] = {"delta_auc": deltas, "lossless": lossless}
    return {
        "table": table,
        "verdicts": verdicts,
        "deltas": differences,
        "reference": reference,
        "tolerance": tolerance,
        "runs": [asdict(r) for r in runs],
    }
