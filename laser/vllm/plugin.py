"""LASER's vLLM plug-in: how the drafter gets its model runner and the relaxed rule gets into verification.

vLLM loads the functions of the ``vllm.general_plugins`` entry-point group in every process it starts
(the caller, the engine core, each worker); ours is :func:`register` (declared in ``pyproject.toml``).
It does three things and nothing else:

1. checks that the installed vLLM has every class, method, parameter, field and call LASER relies on
   (:func:`check_vllm`, which reads vLLM's source: :mod:`laser.vllm.requirements`). Any vLLM whose
   source passes is accepted; the series the checks were run on are ``requirements.TESTED`` (0.26-0.33), and
   another series passing them is used with a warning. If a need is missing it installs nothing and
   remembers ONE line naming what is missing; a laser proposer built later raises that line (vLLM itself
   keeps working for everyone else);
2. wraps ``GPUModelRunner.__init__`` (the base of vLLM's CPU and GPU model runners) in
   :func:`_runner_init_hook`: after vLLM built the runner, if the runner's drafter is a
   :class:`laser.vllm.proposer.LaserProposer` (speculative method ``custom_class``), the proposer is
   attached to the runner (it reads the batch's request ids and each request's
   ``sampling_params.extra_args``) and the runner's rejection sampler becomes a
   :class:`laser.vllm.relaxed.LaserRejectionSampler` (vLLM's own sampler class, plus the relaxed rule on
   the processed logits). This wrapper is the one place LASER touches a vLLM model class; vLLM's
   ``custom_class`` proposer hook hands the proposer ``vllm_config`` only, so this is how it meets the
   runner without walking stack frames. Runners of other drafters are left as vLLM built them.
3. wraps ``SamplingParams.verify`` (vLLM's front end checks each request with it before admission) in
   :func:`_verify_hook`: a request's LASER arguments are checked there, so a malformed one is refused to
   its caller (the OpenAI server answers 400) instead of raising in the proposer, which kills the engine.

Nothing falls back in silence: a laser proposer whose runner was never attached (plug-in not installed,
filtered out by ``VLLM_PLUGINS``, another model-runner implementation) raises :data:`PROBLEM` or
:func:`not_attached_message` when vLLM loads its model.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from laser.vllm.requirements import RUNNER_ATTRS, TESTED, Source, check, installed_source

log = logging.getLogger(__name__)

PLUGIN_NAME = "laser"  # our entry point's name in vllm.general_plugins (what VLLM_PLUGINS must allow)

PROBLEM: str | None = None  # why the plug-in did not install, in one line (None: installed or not tried)
_installed = False


def check_vllm(source: Source | None = None) -> str | None:
    """None if ``source`` (default: the installed vLLM) has everything LASER uses, else one line naming
    what is missing. A version outside ``TESTED`` that passes is accepted with a warning."""
    source = source if source is not None else installed_source()
    if source is None:
        return "laser's vLLM plug-in: vLLM is not installed"
    report = check(source)
    if not report.ok:
        return f"laser's vLLM plug-in: vLLM {report.version} lacks what LASER uses: {'; '.join(report.missing)}"
    if not report.tested:
        low, high = (".".join(map(str, s)) for s in TESTED)
        log.warning(
            "laser's vLLM plug-in: vLLM %s passes its checks but was tested on %s-%s", report.version, low, high
        )
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
    from vllm.sampling_params import SamplingParams

    if not getattr(SamplingParams.verify, "_laser_hook", False):
        SamplingParams.verify = _verify_hook(SamplingParams.verify)  # type: ignore[method-assign]
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


def _verify_hook(original: Callable[..., None]) -> Callable[..., None]:
    """``SamplingParams.verify`` (vLLM's front end, before admission) followed by the check of the request's
    LASER arguments (:func:`laser.vllm.request_args.check_admission`): a malformed one is refused to its
    caller instead of failing in the proposer, where it would kill vLLM's engine core."""
    from vllm.exceptions import VLLMValidationError

    from laser.vllm.request_args import LaserArgsError, check_admission

    @functools.wraps(original)
    def verify(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        model_config = kwargs.get("model_config", args[0] if args else None)
        spec_config = kwargs.get("speculative_config", args[1] if len(args) > 1 else None)
        try:
            check_admission(self.extra_args, self.temperature, _vocab(model_config), _spec_tokens(spec_config))
        except LaserArgsError as exc:  # vLLM's client error: the server answers 400 with the line, not 500
            raise VLLMValidationError(str(exc)) from None

    verify._laser_hook = True  # type: ignore[attr-defined]
    return verify


def _vocab(model_config: Any) -> int | None:
    """The model's vocabulary size from vLLM's ``ModelConfig`` (None where it cannot say)."""
    try:
        return int(model_config.get_vocab_size())
    except Exception:  # noqa: BLE001 - no config, or one without a vocabulary: the static bounds still hold
        return None


def _spec_tokens(spec_config: Any) -> int | None:
    """The engine's ``num_speculative_tokens`` (None without speculation)."""
    n = getattr(spec_config, "num_speculative_tokens", None)
    return int(n) if isinstance(n, int) else None


def not_attached_message() -> str:
    """The one line a laser proposer raises when no runner was attached to it."""
    if PROBLEM is not None:
        return PROBLEM
    if not _installed:
        return (
            f"laser's vLLM plug-in is not loaded in this process: install the project (pip install -e . or its wheel) "
            f"so that vLLM finds the '{PLUGIN_NAME}' entry point of group vllm.general_plugins, and let "
            f"VLLM_PLUGINS (if set) include '{PLUGIN_NAME}'"
        )
    return (
        "laser's vLLM plug-in is loaded but vLLM built the laser proposer outside GPUModelRunner "
        "(another model-runner implementation, e.g. VLLM_USE_V2_MODEL_RUNNER?): unsupported"
    )
