"""Reading job configs: YAML files of `laser run`, `--set` overrides, validation against the schema in
``pipelines/config.py`` (re-exported here).

Every block forbids unknown keys, so a typo fails with the dotted key named. ``load_config`` reads a
YAML file, applies ``a.b=value`` overrides and validates. An override's value is a string, taken whole
(``#``, ``:`` and spaces included), unless it reads as a number (``3``, ``0.5``), a boolean (``true``,
``false``), ``null``, or a list or mapping in brackets (``[1, 2]``, ``{a: 1}``).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, TypeVar, overload

import yaml
from pydantic import ValidationError

from pipelines.config import ConfigError, JobConfig

CONFIG_DIR = Path(__file__).parent / "configs"
_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


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
            raise ConfigError(f"{source}: cannot set {dotted!r}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def override_value(key: str, raw: str) -> Any:
    """The value of ``--set key=raw``: a number, boolean, null, or bracketed list/mapping when ``raw`` reads
    as one; otherwise the text itself (never cut at a ``#`` or ``: ``)."""
    text = raw.strip()
    if text.startswith(("[", "{")):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: value {raw!r} is not a valid list or mapping ({exc})") from exc
    lower = text.lower()
    if lower in ("true", "false"):
        return lower == "true"
    if lower in ("null", "~"):
        return None
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def apply_overrides(tree: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """A copy of ``tree`` with ``key.path=value`` overrides applied (values parsed as YAML)."""
    out = copy.deepcopy(tree)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        _set_dotted(out, key.strip(), override_value(key.strip(), raw), f"--set {item!r}")
    return out


def format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid job config"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        detail = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(
            f"  {key}: {detail}" + ("" if err["type"] == "extra_forbidden" else f" (got {err.get('input')!r})")
        )
    return "\n".join(lines)


def validate_config(tree: dict[str, Any], source: str = "config", schema: type[JobConfig] = JobConfig) -> JobConfig:
    """Validate a config mapping against ``schema`` (a job config class); errors list every bad dotted key."""
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file as a mapping (an empty file is an empty mapping)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{p}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r}); "
            "save the config as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from exc
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: top level must be a mapping of config blocks, got {type(tree).__name__}")
    return tree


_Config = TypeVar("_Config", bound=JobConfig)


@overload
def load_config(path: str | Path | None, overrides: list[str] | None = None) -> JobConfig: ...


@overload
def load_config(path: str | Path | None, overrides: list[str] | None = None, *, schema: type[_Config]) -> _Config: ...


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, schema: type[JobConfig] = JobConfig
) -> JobConfig:
    """Read ``path`` (None = all defaults), apply ``--set`` overrides and validate against ``schema``."""
    tree = read_yaml(path) if path is not None else {}
    return validate_config(apply_overrides(tree, overrides), str(path or "defaults"), schema)


def bundled_config(name: str) -> Path:
    """Path of a config shipped in ``jobs/configs`` (e.g. ``"demo"``)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"no bundled config {name!r}; shipped: {shipped}")
    return path
