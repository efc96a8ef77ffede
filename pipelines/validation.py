"""Input validation before a job creates anything: decoders, their parameters, the dataset.

Errors are :class:`JobInputError` with a one-line message naming the config key or the file; the CLI
prints it and exits with code 2, as it does for config-schema errors.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)


class JobInputError(ValueError):
    """A job input (decoder, decoder parameter, dataset file) that cannot work; the message names it."""


def check_decoder(name: str, params: dict[str, Any], key: str = "decoder") -> None:
    """Fail before any actor starts when the decoder is unknown, a parameter is not one it takes, or a
    parameter value is rejected (the decoder is built once on a tiny random model to check values)."""
    import laser

    decoders = laser.available_decoders()
    if name not in decoders:
        raise JobInputError(f"{key}.name: unknown decoder {name!r}; available: {sorted(decoders)}")
    sig = inspect.signature(decoders[name].__init__)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        accepted = [n for n in sig.parameters if n not in ("self", "lm")]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise JobInputError(f"{key}.params.{unknown[0]}: decoder {name!r} takes no parameter {unknown[0]!r} "
                                f"(it takes {accepted})")
    from laser.testing import tiny_llama

    # a ``truncate:N`` draft needs a probe model with at least N layers (the real target is checked on load)
    wanted = [int(v.split(":", 1)[1]) for v in params.values()
              if isinstance(v, str) and v.startswith("truncate:") and v.split(":", 1)[1].isdigit()]
    try:
        laser.get_decoder(name, tiny_llama(layers=max([2, *wanted])), **params)
    except (ValueError, TypeError) as exc:
        raise JobInputError(f"{key}.params: {exc}") from None


def load_inputs(load: Any, *args: Any) -> Any:
    """``load(*args)`` with a missing or unreadable data file turned into a :class:`JobInputError`."""
    from pipelines.data.readers import DataFileError

    try:
        return load(*args)
    except (FileNotFoundError, DataFileError) as exc:
        raise JobInputError(str(exc).strip("'\"")) from None
