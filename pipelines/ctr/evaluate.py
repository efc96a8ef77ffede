"""One `laser ctr-eval` comparison: load the dataset and its old/new split, encode each knowledge source
(cached beside it), train DIN and DCNv2 without knowledge and with every source over each seed, and
summarise with paired 95% intervals. A source is called lossless vs the reference (default ``greedy``)
only when |mean paired delta AUC| <= ``lossless_tolerance`` for every model."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from pipelines.ctr.config import MODEL_LABELS, NO_KNOWLEDGE, CtrEvalConfig

if TYPE_CHECKING:
    import polars as pl

    from pipelines.data.schema import Dataset, Split

log = logging.getLogger(__name__)


def run_ctr_eval(cfg: CtrEvalConfig, progress: bool = True) -> dict:
    """Run the comparison described by ``cfg`` and return the JSON-ready summary."""
    import torch

    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, progress)
    finally:
        torch.set_num_threads(threads_before)


def _run(cfg: CtrEvalConfig, progress: bool) -> dict:
    from pipelines.ctr.compare import compare_sources, summarise
    from pipelines.ctr.features import ItemCatalog
    from pipelines.ctr.networks import ModelConfig
    from pipelines.ctr.train import TrainConfig

    started = time.perf_counter()
    ds, split, samples = _prepare(cfg)
    catalog = ItemCatalog.build(ds.items, extra_item_ids=ds.interactions["item_id"].unique().to_list())
    sources, vector_files, knowledge_rows = _encode_sources(cfg, samples, progress)
    model_cfg = ModelConfig(**{**cfg.model.model_dump(), "mlp": tuple(cfg.model.mlp)})
    runs = compare_sources(
        samples,
        catalog,
        sources,
        tuple(cfg.models),
        tuple(cfg.seeds),
        model_cfg,
        TrainConfig(**cfg.train.model_dump()),
        cfg.history_len,
        cfg.split_fractions,
        progress,
    )
    summary = summarise(runs, cfg.reference, cfg.lossless_tolerance)
    return _result(cfg, ds, split, samples, vector_files, knowledge_rows, summary, started)


def _prepare(cfg: CtrEvalConfig) -> tuple[Dataset, Split, pl.DataFrame]:
    """The dataset, its old/new split and the CTR samples built from it (an error when there are none)."""
    from pipelines.ctr.samples import build_samples
    from pipelines.data import load_dataset, split_old_new

    ds = load_dataset(cfg.dataset)
    split = split_old_new(
        ds,
        seed=cfg.dataset.seed,
        max_hist=cfg.split.max_hist,
        new_item_fraction=cfg.split.new_item_fraction,
        new_count=cfg.split.new_count,
    )
    samples = build_samples(
        split.old_interactions,
        split.new_interactions,
        cfg.label_threshold(),
        cfg.history_len,
        negatives=cfg.negatives,
        seed=cfg.dataset.seed,
        min_positive_weight=cfg.dataset.min_positive_weight,
        seen=ds.interactions,
    )
    if samples.height == 0:
        raise ValueError(f"dataset {ds.name!r} has no new interactions to build CTR samples from")
    return ds, split, samples


def _encode_sources(
    cfg: CtrEvalConfig, samples: pl.DataFrame, progress: bool
) -> tuple[dict[str, Any], dict[str, str], dict[str, dict[str, int]]]:
    """Each knowledge source encoded (vectors cached beside it): the sources by name (no knowledge first),
    their vector files and their user/item row counts."""
    from pipelines.ctr.features import KnowledgeVectors
    from pipelines.ops.features.encoding import encode_knowledge

    sources: dict[str, Any] = {NO_KNOWLEDGE: None}
    vector_files: dict[str, str] = {}
    knowledge_rows: dict[str, dict[str, int]] = {}
    for name, path in cfg.knowledge.items():
        vectors = encode_knowledge(path, cfg.encoder, batch_size=cfg.encode_batch_size, progress=progress)
        vector_files[name] = str(vectors)
        sources[name] = KnowledgeVectors.from_parquet(vectors)
        knowledge_rows[name] = {"user": len(sources[name].user), "item": len(sources[name].item)}
        _log_coverage(name, sources[name], samples)
    return sources, vector_files, knowledge_rows


def _result(
    cfg: CtrEvalConfig,
    ds: Dataset,
    split: Split,
    samples: pl.DataFrame,
    vector_files: dict[str, str],
    knowledge_rows: dict[str, dict[str, int]],
    summary: dict,
    started: float,
) -> dict:
    """The JSON-ready summary of a run: sample sizes, sources, config, the comparison and its verdict."""
    from pipelines.ctr.compare import as_float

    sample = {
        "users": ds.users.height,
        "items": ds.items.height,
        "interactions": ds.interactions.height,
        "old_interactions": split.old_interactions.height,
        "new_interactions": split.new_interactions.height,
    }
    return {
        "dataset": ds.name,
        "sample": sample,
        "n_samples": samples.height,
        "positive_rate": as_float(samples["label"].mean(), "ctr samples' label"),
        "encoder": cfg.encoder,
        "vectors": vector_files,
        "knowledge_rows": knowledge_rows,
        "config": cfg.model_dump(mode="json"),
        **summary,
        "verdict": verdict_text(summary),
        "wall_s": time.perf_counter() - started,
    }


def verdict_text(summary: dict) -> str:
    """One sentence per source from the paired 95% intervals: vs no knowledge (helps / hurts / no clear
    difference in AUC, per model) and vs the reference (the lossless verdict, and whether the interval
    of the AUC difference holds 0)."""
    parts = []
    for source, per_base in summary.get("deltas", {}).items():
        words = []
        for base, per_model in per_base.items():
            name = base.removeprefix("vs_")
            for m, d in per_model.items():
                lo, hi = d["auc_ci95"]
                if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
                    how = "no interval"
                elif lo > 0:
                    how = "higher"
                elif hi < 0:
                    how = "lower"
                else:
                    how = "not distinguishable"
                words.append(f"{MODEL_LABELS.get(m, m)} AUC vs {name} {how} ({d['auc']:+.4f})")
        verdict = summary.get("verdicts", {}).get(source)
        tail = (
            ""
            if verdict is None
            else f"; {'lossless' if verdict['lossless'] else 'not lossless'} vs {summary['reference']}"
        )
        parts.append(f"{source}: " + ", ".join(words) + tail + ".")
    return " ".join(parts)


def _log_coverage(name: str, vectors: Any, samples: Any) -> None:
    users = set(samples["user_id"].to_list())
    items = set(samples["item_id"].to_list())
    log.info(
        "knowledge %r covers %d/%d sample users and %d/%d sample items",
        name,
        len(users & vectors.user.keys()),
        len(users),
        len(items & vectors.item.keys()),
        len(items),
    )


def nan_to_none(obj: Any) -> Any:
    """NaN (AUC of a one-class test set) -> null, so the JSON is strict."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nan_to_none(v) for v in obj]
    return obj
