"""`DatasetConfig`: which dataset to load and how much of it (the `dataset:` block of a job config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DatasetFormat = Literal["synthetic", "movielens", "amazon", "table"]
Domain = Literal["movie", "book"]
Feedback = Literal["explicit", "implicit"]

# Domain a format gets when `domain` is not set.
DEFAULT_DOMAIN: dict[str, Domain] = {"synthetic": "movie", "movielens": "movie", "amazon": "book", "table": "movie"}


class SyntheticParams(BaseModel):
    """Size and shape of the generated demo dataset (format "synthetic")."""

    model_config = ConfigDict(extra="forbid")

    n_users: int = Field(default=300, ge=2, description="users in the dataset")
    n_items: int = Field(default=400, ge=4, description="items in the dataset")
    n_clusters: int = Field(default=5, ge=1, description="planted taste clusters")
    min_history: int = Field(default=6, ge=2, description="fewest interactions of a warm user")
    max_history: int = Field(default=40, ge=2, description="most interactions of a warm user")
    cold_user_fraction: float = Field(default=0.1, ge=0.0, le=1.0, description="share of users with 1-3 interactions")
    cold_item_fraction: float = Field(default=0.1, ge=0.0, le=1.0, description="share of items with 0-2 interactions")
    in_cluster_share: float = Field(
        default=0.75, ge=0.0, le=1.0, description="share of a user's picks from cluster genres"
    )

    @model_validator(mode="after")
    def _history_bounds(self) -> "SyntheticParams":
        if self.min_history > self.max_history:
            raise ValueError(f"min_history ({self.min_history}) exceeds max_history ({self.max_history})")
        return self


class TableColumns(BaseModel):
    """Source column names for format "table" (canonical name -> name in the file)."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = "user_id"
    item_id: str = "item_id"
    rating: str = "rating"
    timestamp: str = "timestamp"
    title: str = "title"
    genres: str = "genres"
    category: str = "category"
    sub_category: str = "sub_category"
    year: str = "year"
    # implicit feedback (dataset.feedback: implicit) only; unmapped by default
    weight: str | None = Field(default=None, description="how strong each interaction is: a count, dwell seconds")
    event: str | None = Field(default=None, description="what the user did: view, click, cart, purchase, ...")


class DatasetConfig(BaseModel):
    """Which dataset to load; embedded in job configs under ``dataset:``.

    ``path`` is a directory (MovieLens files, Amazon JSON lines, table files) or a single file
    (Amazon reviews file, table interactions file). ``limit_users``/``limit_items`` keep a seeded sample
    for trial runs. Unknown keys are rejected with the key named.
    """

    model_config = ConfigDict(extra="forbid")

    format: DatasetFormat = "synthetic"
    path: str | None = None
    name: str | None = Field(default=None, description="dataset name in outputs; default from format and path")
    domain: Domain | None = Field(default=None, description="prompt variant; default movie, book for Amazon")
    limit_users: int | None = Field(
        default=None,
        ge=1,
        description="trial sample: this many users, drawn in a seeded order "
        "among those with interactions (pipelines/data/load.py, limit_dataset)",
    )
    limit_items: int | None = Field(
        default=None, ge=1, description="trial sample: at most this many items; how they are chosen is sample_items"
    )
    sample_items: Literal["most_rated", "whole_histories"] = Field(
        default="most_rated",
        description="most_rated: the limit_users users, then the limit_items items they rated most "
        "(first those that give every kept user a rating), histories cut to the kept items; whole_histories: "
        "histories never cut, users whose history would take the items past limit_items passed over",
    )
    seed: int = 0
    min_positive_rating: float = Field(default=4.0, description="ratings >= this count as positive (graph, CTR labels)")
    feedback: Feedback = Field(
        default="explicit",
        description="explicit: ratings; implicit: clicks, views, purchases (no rating; each interaction has a weight)",
    )
    event_weights: dict[str, float] | None = Field(
        default=None,
        description="implicit: weight of each value of columns.event (e.g. {purchase: 3, cart: 2, click: 1, view: "
        "0.5}); rows with another event are skipped and counted; unset: every event weighs 1",
    )
    min_positive_weight: float | None = Field(
        default=None, description="implicit: weights >= this are positives (LightGCN graph); unset: any weight > 0"
    )
    synthetic: SyntheticParams = Field(default_factory=SyntheticParams)
    # Amazon: file names inside `path` (default: auto-detect; metadata files start with "meta").
    reviews_file: str | None = None
    metadata_file: str | None = None
    # Table: files inside `path` (or `path` is the interactions file) and the column mapping.
    interactions_file: str | None = None
    items_file: str | None = None
    users_file: str | None = None
    columns: TableColumns = Field(default_factory=TableColumns)
    genres_separator: str = Field(default="|", description="separator when genres is a string column (table)")
    timestamp_format: str = Field(
        default="epoch",
        min_length=1,
        description=(
            "how a text timestamp column is read (table): epoch (unix seconds), iso (ISO 8601 date or date-time, "
            "UTC), or a strftime format such as %d/%m/%Y; digits are always unix seconds; rows that do not match "
            "are skipped and counted, naming the column"
        ),
    )
    rating_scale: tuple[float, float] | None = Field(
        default=None,
        description=(
            "[min, max] of valid ratings; rows outside are skipped and counted (NaN and negative ratings always are)"
        ),
    )

    @model_validator(mode="after")
    def _path_needed(self) -> "DatasetConfig":
        if self.format != "synthetic" and not self.path:
            raise ValueError(f"dataset.path is required for format {self.format!r}")
        return self

    @model_validator(mode="after")
    def _scale_ordered(self) -> "DatasetConfig":
        if self.rating_scale is not None and not self.rating_scale[0] <= self.rating_scale[1]:
            raise ValueError(f"dataset.rating_scale: min {self.rating_scale[0]} exceeds max {self.rating_scale[1]}")
        return self

    @model_validator(mode="after")
    def _implicit_keys(self) -> "DatasetConfig":
        if self.feedback == "explicit":
            used = [f"columns.{k}" for k in ("weight", "event") if getattr(self.columns, k) is not None]
            used += [k for k in ("event_weights", "min_positive_weight") if getattr(self, k) is not None]
            if used:
                raise ValueError(
                    f"dataset.{', dataset.'.join(used)}: implicit feedback only; set dataset.feedback: implicit"
                )
        elif self.rating_scale is not None:
            raise ValueError("dataset.rating_scale: explicit feedback only (implicit feedback reads no rating)")
        if self.event_weights is not None:
            if self.columns.event is None:
                raise ValueError("dataset.event_weights needs dataset.columns.event (the column holding the events)")
            if bad := {k: v for k, v in self.event_weights.items() if not v >= 0 or v == float("inf")}:
                raise ValueError(f"dataset.event_weights: weights must be finite and >= 0, got {bad}")
        return self

    def resolved_domain(self) -> Domain:
        """The prompt domain: ``domain`` when set, else the format's default."""
        return self.domain or DEFAULT_DOMAIN[self.format]
