"""The YAML schema of `laser ctr-eval` and the names every CTR module shares. Free of torch: the CLI reads
and checks a config before anything heavy loads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.config import SplitConfig, _Strict
from pipelines.data.config import DatasetConfig

NO_KNOWLEDGE = "none"  # the source name of the models trained without knowledge inputs
MODEL_LABELS = {"din": "DIN", "dcnv2": "DCNv2"}
# equals pipelines.ops.features.encoding.DEFAULT_ENCODER, which loads torch (tests/integration/test_cli_small.py)
DEFAULT_ENCODER = "all-minilm-l6-v2"

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
