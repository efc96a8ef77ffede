"""`laser ctr-eval CONFIG`: does knowledge from a faster decoder serve CTR models as well as greedy?

Loads the dataset and its old/new split, encodes each knowledge source (cached beside it), trains DIN
and DCNv2 without knowledge ("none") and with every source over each seed, prints the paper's Table 2
layout and writes JSON. A source is called lossless vs the reference (default ``greedy``) only when
|mean paired delta AUC| <= ``lossless_tolerance`` for every model.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rich.console import Console
from rich.table import Table

from jobs.config import ConfigError, apply_overrides, format_errors, read_yaml
from pipelines.config import SplitConfig
from pipelines.data.config import DatasetConfig

log = logging.getLogger(__name__)

# torch, scikit-learn and the CTR models load only when the command runs (`laser --help` stays fast);
# these names equal pipelines.ctr.NO_KNOWLEDGE, pipelines.ops.features.encoding.DEFAULT_ENCODER and
# pipelines.ctr.MODEL_LABELS (tests/test_cli_small.py checks it).
NO_KNOWLEDGE = "none"
DEFAULT_ENCODER = "all-minilm-l6-v2"
MODEL_LABELS = {"din": "DIN", "dcnv2": "DCNv2"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


CtrModelName = Literal["din", "dcnv2"]
CTR_MODELS: tuple[CtrModelName, ...] = ("din", "dcnv2")


class CtrTrainParams(_Strict):
    """Adam + early stopping on validation log loss."""

    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=256, ge=1)
    max_epochs: int = Field(default=20, ge=1)
    patience: int = Field(default=3, ge=1, description="epochs without a better validation loss before stopping")


class CtrModelParams(_Strict):
    """Sizes of DIN / DCNv2 and the mixture-of-experts knowledge converter."""

    embed_dim: int = Field(default=16, ge=1)
    converter_dim: int = Field(
        default=32, ge=1, description="knowledge vector dim -> this, per entity (KAR uses 32/64)"
    )
    n_experts: int = Field(default=4, ge=1)
    expert_hidden: int = Field(default=128, ge=1)
    mlp: list[int] = Field(default_factory=lambda: [200, 80], min_length=1)
    cross_layers: int = Field(default=3, ge=1, description="DCNv2 cross layers")
    dropout: float = Field(default=0.0, ge=0, lt=1)


class CtrEvalConfig(_Strict):
    """The YAML schema of `laser ctr-eval`. Relative knowledge paths are read from the working directory."""

    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    knowledge: dict[str, str] = Field(default_factory=dict, description="source name -> knowledge store/Parquet path")
    reference: str = Field(default="greedy", description="the lossless baseline source the others are compared with")
    encoder: str = Field(
        default=DEFAULT_ENCODER, description="packaged encoder name or local transformers encoder folder"
    )
    encode_batch_size: int = Field(default=32, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    rating_threshold: float | None = Field(
        default=None, description="label = rating >= this; default dataset.min_positive_rating"
    )
    history_len: int = Field(default=5, ge=1)
    negatives: int = Field(
        default=4, ge=0, description="implicit feedback: label-0 samples per positive (items the user never touched)"
    )
    models: list[CtrModelName] = Field(default_factory=lambda: list(CTR_MODELS), min_length=1)
    split_fractions: tuple[float, float, float] = Field(
        default=(0.8, 0.1, 0.1), description="train/val/test share of users"
    )
    lossless_tolerance: float = Field(default=0.002, ge=0)
    threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads for training; null = torch's default"
    )
    train: CtrTrainParams = Field(default_factory=CtrTrainParams)
    model: CtrModelParams = Field(default_factory=CtrModelParams)

    @field_validator("knowledge")
    @classmethod
    def _no_reserved_name(cls, v: dict[str, str]) -> dict[str, str]:
        if NO_KNOWLEDGE in v:
            raise ValueError(f"{NO_KNOWLEDGE!r} is reserved for the model without knowledge inputs")
        return v

    @model_validator(mode="after")
    def _fractions(self) -> "CtrEvalConfig":
        if min(self.split_fractions) <= 0 or abs(sum(self.split_fractions) - 1.0) > 1e-9:
            raise ValueError(f"split_fractions must be positive and sum to 1, got {list(self.split_fractions)}")
        if self.dataset.feedback == "implicit" and self.rating_threshold is not None:
            raise ValueError(
                "rating_threshold: explicit feedback only (implicit labels follow dataset.min_positive_weight)"
            )
        if self.dataset.feedback == "explicit" and "negatives" in self.model_fields_set:
            raise ValueError("negatives: implicit feedback only (set dataset.feedback: implicit)")
        return self

    def label_threshold(self) -> float:
        return self.rating_threshold if self.rating_threshold is not None else self.dataset.min_positive_rating


def load_ctr_config(path: str | Path, overrides: list[str] | None = None) -> CtrEvalConfig:
    """Read a ctr-eval YAML, apply ``key=value`` overrides and validate; errors name the bad key."""
    try:
        return CtrEvalConfig.model_validate(apply_overrides(read_yaml(path), overrides))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, str(path))) from None


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
    from pipelines.ctr import (
        ItemCatalog,
        KnowledgeVectors,
        ModelConfig,
        TrainConfig,
        build_samples,
        compare_sources,
        summarise,
    )
    from pipelines.ctr.compare import as_float
    from pipelines.data import load_dataset, split_old_new
    from pipelines.ops.features.encoding import encode_knowledge

    started = time.perf_counter()
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
    catalog = ItemCatalog.build(ds.items, extra_item_ids=ds.interactions["item_id"].unique().to_list())
    sources: dict[str, Any] = {NO_KNOWLEDGE: None}
    vector_files: dict[str, str] = {}
    knowledge_rows: dict[str, dict[str, int]] = {}
    for name, path in cfg.knowledge.items():
        vectors = encode_knowledge(path, cfg.encoder, batch_size=cfg.encode_batch_size, progress=progress)
        vector_files[name] = str(vectors)
        sources[name] = KnowledgeVectors.from_parquet(vectors)
        knowledge_rows[name] = {"user": len(sources[name].user), "item": len(sources[name].item)}
        _log_coverage(name, sources[name], samples)
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


def _nan_to_none(obj):
    """NaN (AUC of a one-class test set) -> null, so the JSON is strict."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4f}"


def render_table(result: dict) -> Table:
    """The paper's Table 2 layout: one row per knowledge source, AUC / LL per model (means over seeds)."""
    models = result["config"]["models"]
    seeds = result["config"]["seeds"]
    table = Table(title=f"Downstream CTR on {result['dataset']} (test set, mean over seeds {seeds})")
    table.add_column("knowledge")
    for m in models:
        table.add_column(f"{MODEL_LABELS[m]} AUC", justify="right")
        table.add_column(f"{MODEL_LABELS[m]} LL", justify="right")
    compared = [m for m in models if any(m in v["delta_auc"] for v in result["verdicts"].values())]
    for m in compared:
        table.add_column(f"ΔAUC {MODEL_LABELS[m]}", justify="right")
    table.add_column(f"vs {result['reference']}")
    for source, per_model in result["table"].items():
        cells = [c for m in models for c in (_fmt(per_model[m]["auc_mean"]), _fmt(per_model[m]["logloss_mean"]))]
        verdict = result["verdicts"].get(source)
        if verdict is None:
            table.add_row(source, *cells, *[""] * len(compared), "")
            continue
        deltas = [f"{verdict['delta_auc'][m]:+.4f}" if m in verdict["delta_auc"] else "" for m in compared]
        table.add_row(source, *cells, *deltas, "lossless" if verdict["lossless"] else "differs")
    return table


def ctr_eval(
    config: Path = typer.Argument(..., help="ctr-eval YAML (see jobs/configs/ctr_eval_demo.yaml)"),
    json_out: Path | None = typer.Option(
        None,
        "--json",
        help="write the full results here, with a Markdown table and a PNG beside it (same name, .md / .png)",
    ),
    overrides: list[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
) -> None:
    """Train DIN and DCNv2 with no knowledge and with each knowledge source; print Table 2, write JSON."""
    try:
        cfg = load_ctr_config(config, overrides)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if cfg.reference not in cfg.knowledge:
        log.warning(
            "reference source %r not in knowledge %s: no lossless verdicts", cfg.reference, sorted(cfg.knowledge)
        )
    result = run_ctr_eval(cfg)
    Console().print(render_table(result))
    for source, verdict in result["verdicts"].items():
        if verdict["lossless"]:
            Console().print(
                f"[green]{source}: lossless vs {cfg.reference}[/green] "
                f"(|mean ΔAUC| <= {cfg.lossless_tolerance} for every model over {len(cfg.seeds)} seeds)"
            )
    Console().print(f"verdict (95% intervals over {len(cfg.seeds)} seeds): {result['verdict']}")
    if json_out is not None:
        from pipelines.ctr.report import markdown, plot

        json_out.parent.mkdir(parents=True, exist_ok=True)
        clean = _nan_to_none(result)
        json_out.write_text(json.dumps(clean, indent=2, allow_nan=False))
        json_out.with_suffix(".md").write_text(markdown(clean))
        plot(clean, json_out.with_suffix(".png"))
        log.info("wrote %s and its .md and .png", json_out)


def register(app: typer.Typer) -> None:
    app.command("ctr-eval")(ctr_eval)
