"""Reading job configs: YAML files of `laser run`, `--set` overrides, validation against the schema in
``pipelines/config.py`` (re-exported here).

Every block forbids unknown keys, so a typo fails with the dotted key named. ``load_config`` reads a
YAML file, applies ``a.b=value`` overrides and validates. An override's value is a string, taken whole
(``#``, ``:`` and spaces included), unless it reads as a number (``3``, ``0.5``), a boolean (``true``,
``false``), ``null``, or a list or mapping in brackets (``[1, 2]``, ``{a: 1}``).
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any, TypeVar, get_args, overload

import yaml
from pydantic import BaseModel, ValidationError

from pipelines.config import ConfigError, JobConfig
from pipelines.config import engine_arg_problem, vllm_engine_arg_names

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


# names people bring from vLLM and transformers -> the job's key for the same thing
FOREIGN_NAMES: dict[str, str] = {
    "max_tokens": "generation.max_new_tokens",
    "max_completion_tokens": "generation.max_new_tokens",
    "min_tokens": "generation.min_new_tokens",
    "stop": "generation.stop_strings",
    "tensor_parallel_size": "execution.gpus_per_worker",
    "num_gpus": "execution.gpus_per_worker",
    "num_cpus": "execution.threads_per_worker",
    "max_num_seqs": "execution.batch_size",
    "enforce_eager": "execution.compile",
    "num_beams": "generation.beam_width",
    "do_sample": "generation.temperature",
    "model_name": "model.name",
    "model_id": "model.name",
    "model_path": "model.name",
    "pretrained_model_name_or_path": "model.name",
    "torch_dtype": "model.dtype",
    "tokenizer_revision": "model.revision",
    "num_speculative_tokens": "decoder.params.K",
    "output_dir": "output.path",
}


def _block(schema: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel] | None:
    """The config block (a pydantic model) at ``path`` under ``schema``, or None."""
    node: type[BaseModel] | None = schema
    for part in path:
        field = node.model_fields.get(part) if node is not None else None
        args = (field.annotation, *get_args(field.annotation)) if field is not None else ()
        node = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return node


def _exists(schema: type[BaseModel], dotted: str) -> bool:
    """Whether ``dotted`` names a key of ``schema`` (a key under a mapping field such as decoder.params counts)."""
    parts = tuple(dotted.split("."))
    for cut in range(len(parts), 0, -1):
        block = _block(schema, parts[: cut - 1])
        if block is not None and parts[cut - 1] in block.model_fields:
            return cut == len(parts) or _block(schema, parts[:cut]) is None
    return False


def _leaves(schema: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Every key name of ``schema`` -> the dotted paths that end in it."""
    out: dict[str, list[str]] = {}
    for name in schema.model_fields:
        out.setdefault(name, []).append(".".join((*prefix, name)))
        sub = _block(schema, (name,))
        for leaf, paths in (_leaves(sub, (*prefix, name)) if sub is not None and len(prefix) < 2 else {}).items():
            out.setdefault(leaf, []).extend(paths)
    return out


def key_hint(schema: type[BaseModel], loc: tuple[str, ...]) -> str:
    """'did you mean ...' for the unknown key at ``loc`` (empty when nothing is near): the job's name for a
    vLLM or transformers name, a near key of the same block, or the same name in another block."""
    name, block = loc[-1], _block(schema, loc[:-1])
    foreign = FOREIGN_NAMES.get(name)
    if foreign is not None and _exists(schema, foreign):
        return f"; did you mean {foreign}?"
    if block is not None:
        close = difflib.get_close_matches(name, list(block.model_fields), n=1, cutoff=0.75)
        if close:
            return f"; did you mean {'.'.join((*loc[:-1], close[0]))}?"
    elsewhere = [p for p in _leaves(schema).get(name, []) if p != ".".join(loc)]
    if elsewhere:
        return f"; did you mean {' or '.join(elsewhere[:3])}?"
    if _block(schema, ("model",)) is not None and engine_arg_problem(name) is None and vllm_engine_arg_names():
        return f"; vLLM's own engine argument {name!r} goes under model.engine_args"
    return ""


def format_errors(exc: ValidationError, source: str, schema: type[BaseModel] | None = None) -> str:
    """One line per bad key, its dotted path named; an unknown key says what it may mean (``schema``: the
    config class validated, whose keys the hints name; None: no hints)."""
    lines = [f"{source}: invalid job config"]
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"] if p != "[key]")  # a bad mapping key: the key is the path's end
        key = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key" + (key_hint(schema, loc) if schema is not None else ""))
            continue
        shown = (
            ""
            if isinstance(err.get("input"), (dict, BaseModel)) or len(loc) < len(err["loc"])
            else f" (got {err.get('input')!r})"
        )
        lines.append(f"  {key}: {err['msg']}{shown}")
    return "\n".join(lines)


def validate_config(tree: dict[str, Any], source: str = "config", schema: type[JobConfig] = JobConfig) -> JobConfig:
    """Validate a config mapping against ``schema`` (a job config class); errors list every bad dotted key."""
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source, schema)) from None


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
