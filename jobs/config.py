"""Job configuration: the YAML schema of `laser run`, validated by pydantic, with `--set` overrides.

Every block forbids unknown keys, so a typo fails with the dotted key named. ``load_config`` reads a
YAML file, applies ``a.b=value`` overrides (values parsed as YAML: ``3`` is an int, ``true`` a bool,
``null`` None, ``[1, 2]`` a list) and validates.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipelines.data.config import DatasetConfig

CONFIG_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    """A job config that cannot be read or validated; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SplitConfig(_Strict):
    """The paper's old/new split (see pipelines/data/split.py)."""

    max_hist: int = Field(30, ge=1, description="old history = first min((n+1)//2, max_hist) interactions")
    new_count: int | None = Field(None, ge=1, description="interactions after the cut that form the new history")
    new_item_fraction: float = Field(0.5, ge=0.0, le=1.0, description="share of items (per category) that are new")


class ModelConfig(_Strict):
    """The target LLM."""

    name: str = Field("smollm2-135m", description="bundled name, local path or cached hub id")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class DecoderConfig(_Strict):
    """The decoder that writes new knowledge, by registry name, with its keyword parameters."""

    name: str = "laser"
    params: dict[str, Any] = Field(default_factory=dict, description="e.g. verification, k, p, K, n_max")


class GenerationConfig(_Strict):
    """Per-request generation limits."""

    max_new_tokens: int = Field(256, ge=1, description="tokens generated per entity at most")
    max_prompt_tokens: int | None = Field(1024, ge=16, description="user histories are cut (oldest first) to fit")


class OldKnowledgeConfig(_Strict):
    """Step 1: the old-knowledge store that pools are built from (generated where missing)."""

    path: str | None = Field(None, description="store directory; default <output.path>/old_knowledge")
    decoder: Literal["autoregressive", "resd", "laser"] = Field(
        "autoregressive", description="greedy decoder for missing old knowledge; decoded without a pool (none "
        "exists yet), so all three write the model's greedy text")
    max_new_tokens: int | None = Field(None, ge=1, description="default: generation.max_new_tokens")
    generate_missing: bool = Field(True, description="generate old knowledge the store lacks")


class RoutingConfig(_Strict):
    """Steps 2 and 3: the binary router, the groups and the pools (see router/ and pools/)."""

    user_policy: Literal["warm_cold", "collaborative", "attribute"] = Field(
        "warm_cold", description="warm_cold: warm users -> collaborative pool, cold -> attribute pool")
    item_policy: Literal["warm_cold", "collaborative", "attribute"] = "attribute"
    warm_threshold: int = Field(5, ge=0, description="warm_cold: at least this many old interactions = warm")
    n_clusters: int = Field(8, ge=1, description="K-means groups over LightGCN embeddings (capped at entities)")
    max_group_size: int = Field(200, ge=1, description="attribute groups larger than this split by sub-category")
    max_pool_size: int = Field(2000, ge=1, description="most old-knowledge texts per pool (seeded sample)")
    lightgcn: dict[str, Any] = Field(default_factory=dict, description="LightGCN overrides: dim, layers, epochs, lr")
    seed: int = 0


class ExecutionConfig(_Strict):
    """Where and how wide the generation runs."""

    num_workers: int = Field(2, ge=1, description="generation actors")
    threads_per_worker: int = Field(1, ge=1, description="torch threads and Ray CPUs per actor")
    address: str | None = Field(None, description="Ray address; null = local Ray started in-process")
    batch_size: int = Field(4, ge=1, description="requests per actor task")
    pool_cache_size: int = Field(8, ge=1, description="pools an actor keeps loaded (LRU)")


class OutputConfig(_Strict):
    """Where the job writes. ``path`` is the job directory (see README, "Running a job")."""

    path: str = "runs/job"
    shard_rows: int = Field(256, ge=1, description="rows per knowledge Parquet shard")
    run_id: str | None = Field(None, description="default: a hash of the config, stable across resumes")


class JobConfig(_Strict):
    """A whole knowledge-generation job."""

    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    decoder: DecoderConfig = Field(default_factory=DecoderConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    old_knowledge: OldKnowledgeConfig = Field(default_factory=OldKnowledgeConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @field_validator("decoder")
    @classmethod
    def _params_are_keywords(cls, v: DecoderConfig) -> DecoderConfig:
        bad = [k for k in v.params if not str(k).isidentifier()]
        if bad:
            raise ValueError(f"decoder.params keys must be keyword names, got {bad}")
        return v

    def resolved_run_id(self) -> str:
        """``output.run_id`` or a short hash of everything that shapes the output (stable on resume)."""
        if self.output.run_id:
            return self.output.run_id
        payload = self.model_dump(mode="json", exclude={"execution": True, "output": {"run_id"}})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    if not dotted or any(not p for p in parts):
        raise ConfigError(f"{source}: bad override key {dotted!r}")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set {dotted!r}: {'.'.join(parts[:i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_overrides(tree: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """A copy of ``tree`` with ``key.path=value`` overrides applied (values parsed as YAML)."""
    out = copy.deepcopy(tree)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key.strip()}: value {raw!r} is not valid YAML ({exc})") from exc
        _set_dotted(out, key.strip(), value, f"--set {item!r}")
    return out


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid job config"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        detail = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {key}: {detail}" + ("" if err["type"] == "extra_forbidden" else f" (got {err.get('input')!r})"))
    return "\n".join(lines)


def validate_config(tree: dict[str, Any], source: str = "config") -> JobConfig:
    """Validate a config mapping; errors list every bad dotted key."""
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file as a mapping (an empty file is an empty mapping)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from exc
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping of config blocks, got {type(tree).__name__}")
    return tree


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> JobConfig:
    """Read ``path`` (None = all defaults), apply ``--set`` overrides and validate."""
    tree = read_yaml(path) if path is not None else {}
    return validate_config(apply_overrides(tree, overrides), str(path or "defaults"))


def bundled_config(name: str) -> Path:
    """Path of a config shipped in ``jobs/configs`` (e.g. ``"demo"``)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"no bundled config {name!r}; shipped: {shipped}")
    return path
