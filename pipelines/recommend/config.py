"""The recommendation job's configuration: the knowledge job's blocks plus ``recommend:``."""

from __future__ import annotations

from pydantic import Field

from pipelines.config import DecoderConfig, JobConfig, _Strict


class RecommendSettings(_Strict):
    """What to recommend and how the items are named to the model."""

    K: int = Field(default=10, ge=1, description="items per user = beam width")
    item_code_column: str | None = Field(
        default=None,
        description="items-table column whose values identify items to the model; null: titles (with year)",
    )
    max_history: int = Field(default=20, ge=1, description="most recent old-history entries shown in the prompt")
    path: str | None = Field(default=None, description="recommendation store; default <output.path>/recommendations")


class RecommendJobConfig(JobConfig):
    """A `laser recommend` job: dataset, split, model, decoder (default ``beam``), execution, output."""

    decoder: DecoderConfig = Field(default_factory=lambda: DecoderConfig(name="beam"))
    recommend: RecommendSettings = Field(default_factory=RecommendSettings)
