"""LASER's vLLM plug-in: how the drafter gets its model runner and the relaxed rule gets into verification.

vLLM loads the functions of the ``vllm.general_plugins`` entry-point group in every process it starts
(the caller, the engine core, each worker); ours is :func:`register` (declared in ``pyproject.toml``).
It does two things and nothing else:

1. checks that the installed vLLM is the series this code was written for (``SUPPORTED``) and that every
   vLLM class, method and field LASER relies on exists (:func:`check_vllm`). If one is missing it
   installs nothing and remembers ONE line naming what is missing; a laser proposer built later raises
   that line (vLLM itself keeps working for everyone else);
2. wraps ``GPUModelRunner.__init__`` (the base of vLLM's CPU and GPU model runners) in
   :func:`_runner_init_hook`: after vLLM built the runner, if the runner's drafter is a
   :class:`laser.vllm.proposer.LaserProposer` (speculative method ``custom_class``), the proposer is
   attached to the runner (it reads the batch's request ids and each request's
   ``sampling_params.extra_args``) and the runner's rejection sampler becomes a
   :class:`laser.vllm.relaxed.LaserRejectionSampler` (vLLM's own sampler class, plus the relaxed rule on
   the processed logits). This wrapper is the one place LASER touches a vLLM class; vLLM's
   ``custom_class`` proposer hook hands the proposer ``vllm_config`` only, so this is how it meets the
   runner without walking stack frames. Runners of other drafters are left as vLLM built them.

Nothing falls back in silence: a laser proposer whose runner was never attached (plug-in not installed,
filtered out by ``VLLM_PLUGINS``, another model-runner implementation) raises :data:`PROBLEM` or
:func:`not_attached_message` when vLLM loads its model.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SUPPORTED = "0.32."  # vLLM series this plug-in was written against (custom_class is experimental there)
PLUGIN_NAME = "laser"  # our entry point's name in vllm.general_plugins (what VLLM_PLUGINS must allow)

PROBLEM: str | None = None  # why the plug-in did not install, in one line (None: installed or not tried)
_installed = False

# what LASER reads from vLLM, checked at start: (module, attribute path)
_REQUIRED = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.__init__"),
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.apply_logits_processors"),
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward"),
    ("vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer"),
    ("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata"),
)
_METADATA_FIELDS = ("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens")
RUNNER_ATTRS = ("input_batch", "requests", "rejection_sampler", "sampler", "speculative_config", "device")


def check_vllm() -> str | None:
    """None if the installed vLLM has everything LASER uses, else one line naming what is missing."""
    import importlib

    try:
        import vllm
    except ImportError as exc:
        return f"laser's vLLM plug-in: vLLM is not importable ({exc})"
    version = str(getattr(vllm, "__version__", "unknown"))
    if not version.startswith(SUPPORTED):
        return (
            f"laser's vLLM plug-in was written for vLLM {SUPPORTED}x, this is vLLM {version}: "
            f"pin vllm(-cpu)=={SUPPORTED}0 or port laser/vllm/plugin.py"
        )
    for module_name, path in _REQUIRED:
        obj: object
        try:
            obj = importlib.import_module(module_name)
        except ImportError as exc:
            return f"laser's vLLM plug-in: vLLM {version} has no module {module_name} ({exc})"
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return f"laser's vLLM plug-in: vLLM {version} has no {module_name}.{path}"
    import dataclasses

    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    fields = {f.name for f in dataclasses.fields(SpecDecodeMetadata)}
    missing = [f for f in _METADATA_FIELDS if f not in fields]
    if missing:
        return f"laser's vLLM plug-in: vLLM {version} SpecDecodeMetadata lacks {missing}"
    return None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: check vLLM, then install :func:`_runner_init_hook` (once per
    process; vLLM may call it several times)."""
    global PROBLEM, _installed
    if _installed:
        return
    PROBLEM = check_vllm()
    if PROBLEM is not None:
        log.warning("%s; laser speculation is disabled in this process", PROBLEM)
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.__init__
    if not getattr(original, "_laser_hook", False):
        GPUModelRunner.__init__ = _runner_init_hook(original)  # type: ignore[method-assign]
    _installed = True


def installed() -> bool:
    return _installed


def _runner_init_hook(original: Callable[..., None]) -> Callable[..., None]:
    """``GPUModelRunner.__init__`` followed by attaching a laser proposer to its runner (the one wrapper)."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if drafter is not None and type(drafter).__module__ == "laser.vllm.proposer":
            missing = [a for a in RUNNER_ATTRS if not hasattr(self, a)]
            if missing:
                raise RuntimeError(f"laser's vLLM plug-in: vLLM's {type(self).__name__} has no {missing}")
            drafter.attach(self)

    __init__._laser_hook = True  # type: ignore[attr-defined]
    return __init__


def not_attached_message() -> str:
    """The one line a laser proposer raises when no runner was attached to it."""
    if PROBLEM is not None:
        return PROBLEM
    if not _installed:
        return (
            f"laser's vLLM plug-in is not loaded in this process: install the project (pip install -e .) "
            f"so that vLLM finds the '{PLUGIN_NAME}' entry point of group vllm.general_plugins, and let "
            f"VLLM_PLUGINS (if set) include '{PLUGIN_NAME}'"
        )
    return (
        "laser's vLLM plug-in is loaded but vLLM built the laser proposer outside GPUModelRunner "
        "(another model-runner implementation, e.g. VLLM_USE_V2_MODEL_RUNNER?): unsupported"
    )
