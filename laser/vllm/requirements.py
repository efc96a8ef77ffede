"""What LASER's vLLM plug-in needs from vLLM, checked by reading vLLM's source: installed or in a wheel.

The needs are one table (:data:`NEEDS`) of classes, methods with their parameter names, dataclass fields,
attributes a constructor sets and the call vLLM makes to a ``custom_class`` drafter. :func:`check` reads
each module's source through a :class:`Source` and parses it (nothing of vLLM is imported or run), so the
same check runs:

- in every process the plug-in loads in (:func:`installed_source`, the vLLM on ``sys.path``), where
  a missing need stops the plug-in with one line naming it (:mod:`laser.vllm.plugin`);
- on a wheel of any vLLM version downloaded and never installed (:func:`wheel_source`,
  ``scripts/check_vllm_wheel.py``).

:data:`FEATURES` are what LASER uses when a version has it and goes without otherwise (the per-request
spec-decoding metrics the engine reads when vLLM's engine core runs in another process, vLLM 0.29+).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TESTED = ((0, 26), (0, 33))  # vLLM series the checks were run on (scripts/check_vllm_wheel.py, CI's 0.32)

RUNNER = "vllm.v1.worker.gpu_model_runner"
SAMPLER = "vllm.v1.sample.rejection_sampler"
# what the plug-in reads off vLLM's model runner once it is built (laser.vllm.plugin, laser.vllm.relaxed)
RUNNER_ATTRS = ("input_batch", "requests", "rejection_sampler", "sampler", "speculative_config", "device")


@dataclass(frozen=True)
class Need:
    """One thing LASER relies on in ``module``: ``name`` (``Class`` or ``Class.method`` or ``function``)
    exists; a callable takes at least ``params`` (by name, in order, after ``self``); a class has the
    dataclass ``fields``; a constructor assigns ``self.<attr>`` for each of ``sets``."""

    module: str
    name: str
    params: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()

    def where(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class ProposeCall:
    """vLLM's model runner calls a ``custom_class`` drafter's ``propose`` with ``positional`` arguments and
    these ``keywords`` (what :meth:`laser.vllm.proposer.LaserProposer.propose` accepts)."""

    module: str = RUNNER
    positional: int = 3
    keywords: tuple[str, ...] = ("slot_mappings",)

    def where(self) -> str:
        return f"{self.module}: the custom_class drafter's propose call"


NEEDS: tuple[Need | ProposeCall, ...] = (
    Need(RUNNER, "GPUModelRunner.__init__", sets=(*RUNNER_ATTRS, "drafter")),
    Need(SAMPLER, "RejectionSampler.__init__", params=("sampler", "spec_config", "device")),
    Need(SAMPLER, "RejectionSampler.forward", params=("metadata", "draft_probs", "logits", "sampling_metadata")),
    Need(SAMPLER, "RejectionSampler.apply_logits_processors", params=("logits", "sampling_metadata", "metadata")),
    Need("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer", params=("vllm_config",)),
    Need(
        "vllm.v1.spec_decode.metadata",
        "SpecDecodeMetadata",
        fields=("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens"),
    ),
    Need("vllm.v1.sample.metadata", "SamplingMetadata", fields=("max_num_logprobs",)),
    ProposeCall(),
    # the job's engine (laser.vllm.engine): a request's arguments, its outputs, the engine core's placement
    Need("vllm.sampling_params", "SamplingParams", fields=("extra_args", "output_kind")),
    Need("vllm.sampling_params", "SamplingParams.verify", params=("model_config",)),  # LASER arguments checked
    Need("vllm.exceptions", "VLLMValidationError"),  # ... and refused as the client's error
    Need("vllm.sampling_params", "RequestOutputKind"),
    Need("vllm.v1.engine.core_client", "InprocClient"),
    Need("vllm.v1.engine.exceptions", "EngineDeadError"),
)

# name -> the need that says a version has it
FEATURES: dict[str, Need] = {
    "per_request_spec_decode_metrics": Need(
        "vllm.engine.arg_utils", "EngineArgs", fields=("per_request_spec_decode_metrics",)
    ),
}


@dataclass(frozen=True)
class Source:
    """A vLLM's source files, read by module name (None: no such module), and its version."""

    version: str
    read: Callable[[str], str | None]


@dataclass
class Report:
    """What :func:`check` found: ``missing`` (one line per unmet need), and which :data:`FEATURES` exist."""

    version: str
    missing: list[str] = field(default_factory=list)
    features: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.missing

    @property
    def tested(self) -> bool:
        """Whether the version is inside :data:`TESTED` (outside it the checks still decide)."""
        return TESTED[0] <= series(self.version) <= TESTED[1]


def series(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string (``0.32.0+cpu`` -> ``(0, 32)``; unreadable -> ``(0, 0)``)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check(source: Source) -> Report:
    """Every need of :data:`NEEDS` and :data:`FEATURES` checked against ``source``."""
    trees: dict[str, ast.Module | None] = {}

    def tree(module: str) -> ast.Module | None:
        if module not in trees:
            text = source.read(module)
            trees[module] = None if text is None else ast.parse(text)
        return trees[module]

    report = Report(source.version)
    for need in NEEDS:
        problem = _problem(need, tree(need.module))
        if problem is not None:
            report.missing.append(f"{need.where()}: {problem}")
    for name, need in FEATURES.items():
        report.features[name] = _problem(need, tree(need.module)) is None
    return report


def _problem(need: Need | ProposeCall, module: ast.Module | None) -> str | None:
    """Why ``need`` is not met in ``module``'s syntax tree, or None."""
    if module is None:
        return "no such module"
    if isinstance(need, ProposeCall):
        return _propose_call_problem(need, module)
    node = _find(module, need.name.split("."))
    if node is None:
        return "not defined"
    if need.params:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return "not a function"
        names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
        names = names[1:] if names[:1] == ["self"] else names
        if tuple(names[: len(need.params)]) != need.params:
            return f"parameters are {names}, LASER passes {list(need.params)}"
    if need.fields:
        if not isinstance(node, ast.ClassDef):
            return "not a class"
        declared = _declared(node)
        missing = [f for f in need.fields if f not in declared]
        if missing:
            return f"has no field(s) {missing}"
    if need.sets:
        assigned = _self_assignments(node)
        missing = [a for a in need.sets if a not in assigned]
        if missing:
            return f"does not set self.{', self.'.join(missing)}"
    return None


def class_fields(source: Source, module: str, name: str) -> frozenset[str] | None:
    """The annotated fields of class ``name`` in ``module`` of ``source`` (a dataclass's fields, e.g.
    ``EngineArgs``'), or None when there is no such module or class."""
    text = source.read(module)
    node = None if text is None else _find(ast.parse(text), [name])
    return _declared(node) if isinstance(node, ast.ClassDef) else None


def _declared(node: ast.ClassDef) -> frozenset[str]:
    return frozenset(s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))


def _find(scope: ast.AST, path: Sequence[str]) -> ast.AST | None:
    """The class or function definition at ``path`` (``["Class", "method"]``) in ``scope``'s body."""
    for node in getattr(scope, "body", []):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == path[0]:
            return node if len(path) == 1 else _find(node, path[1:])
    return None


def _self_assignments(node: ast.AST) -> set[str]:
    """Attribute names assigned on ``self`` anywhere in ``node`` (``self.x = ...``, ``self.x: T = ...``)."""
    names = set()
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def _propose_call_problem(need: ProposeCall, module: ast.Module) -> str | None:
    """The ``propose(...)`` calls under a test of ``method == "custom_class"`` must fit :class:`ProposeCall`."""
    calls = [
        call
        for branch in ast.walk(module)
        if isinstance(branch, ast.If) and _tests_custom_class(branch.test)
        for stmt in branch.body
        for call in ast.walk(stmt)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "propose"
    ]
    if not calls:
        return "no propose call under a custom_class branch"
    for call in calls:
        keywords = tuple(k.arg for k in call.keywords if k.arg is not None)
        if len(call.args) > need.positional or any(k not in need.keywords for k in keywords):
            return f"propose is called with {len(call.args)} positional and keywords {list(keywords)}"
    return None


def _tests_custom_class(test: ast.expr) -> bool:
    return any(isinstance(c, ast.Constant) and c.value == "custom_class" for c in ast.walk(test))


@functools.cache
def installed_has(feature: str) -> bool:
    """Whether the installed vLLM has ``feature`` (a key of :data:`FEATURES`; read once per process)."""
    need = FEATURES[feature]
    source = installed_source()
    text = None if source is None else source.read(need.module)
    return text is not None and _problem(need, ast.parse(text)) is None


def installed_source() -> Source | None:
    """The vLLM on this interpreter's path (read from its files, not imported), or None if there is none."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))

    def read(module: str) -> str | None:
        return _read_file(root.parent, module)

    return Source(_version_in(read("vllm._version")), read)


def _read_file(top: Path, module: str) -> str | None:
    base = top.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def wheel_source(wheel: str | Path) -> Source:
    """A vLLM wheel's source, read from the archive without installing it."""
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())

    def read(module: str) -> str | None:
        base = module.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if name in names:
                return archive.read(name).decode("utf-8")
        return None

    version = _version_in(read("vllm._version"))
    if version == "unknown":  # the wheel's own metadata
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if meta is not None:
            m = re.search(r"^Version: (\S+)", archive.read(meta).decode("utf-8"), re.M)
            version = m.group(1) if m else version
    return Source(version, read)


def _version_in(text: str | None) -> str:
    m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text or "")
    return m.group(1) if m else "unknown"
