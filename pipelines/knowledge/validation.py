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


def check_decoder(name: str, params: dict[str, Any], key: str = "decoder", sampling: dict[str, Any] | None = None,
                  model: str | None = None) -> None:
    """Fail before any actor starts when the decoder is unknown, a parameter is not one it takes, a
    parameter value is rejected (the decoder is built once on a tiny random model to check values), a
    draft model (``params.draft``) is missing or does not share the target ``model``'s vocabulary, or the
    decoder cannot honour the ``sampling`` settings (``generation.temperature`` etc.)."""
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

    draft = params.get("draft")
    if isinstance(draft, str) and not draft.startswith("truncate:"):
        check_draft(draft, model, f"{key}.params.draft")
        params = {**params, "draft": None}  # the tiny model checks the other values
    # a ``truncate:N`` draft needs a probe model with at least N layers (the real target is checked on load)
    wanted = [int(v.split(":", 1)[1]) for v in params.values()
              if isinstance(v, str) and v.startswith("truncate:") and v.split(":", 1)[1].isdigit()]
    try:
        dec = laser.get_decoder(name, tiny_llama(layers=max([2, *wanted])), **params)
    except (ValueError, TypeError) as exc:
        raise JobInputError(f"{key}.params: {exc}") from None
    if sampling:
        from laser.sampling import SamplingParams

        try:
            dec.check_sampling(SamplingParams(float(sampling["temperature"]), float(sampling["top_p"]),
                                              int(sampling["top_k"])))
        except ValueError as exc:
            raise JobInputError(f"generation.temperature={sampling['temperature']}: decoder {name!r} refuses it: "
                                f"{exc}") from None


def check_draft(draft: str, model: str | None, key: str) -> None:
    """A draft model must exist and share the target's vocabulary (tokenizers compared, no weights loaded)."""
    import os

    from laser.models import load_tokenizer

    if draft.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(draft)):
        raise JobInputError(f"{key}: draft model path not found: {draft!r}")
    try:
        draft_vocab = load_tokenizer(os.path.expanduser(draft)).get_vocab()
    except ValueError as exc:
        raise JobInputError(f"{key}: draft model {draft!r} not found: not a local model directory, a bundled name, "
                            f"a name saved by `laser train-draft` or a cached hub id ({exc})") from None
    if model is None:
        return
    target_vocab = load_tokenizer(model).get_vocab()
    if draft_vocab != target_vocab:
        raise JobInputError(f"{key}: draft {draft!r} does not share the target's vocabulary: target {model!r} has "
                            f"{len(target_vocab)} tokens, draft {draft!r} has {len(draft_vocab)}"
                            + (" mapped differently" if len(draft_vocab) == len(target_vocab) else ""))


def load_inputs(load: Any, *args: Any) -> Any:
    """``load(*args)`` with a missing or unreadable data file turned into a :class:`JobInputError`."""
    from pipelines.data.readers import DataFileError

    try:
        return load(*args)
    except (FileNotFoundError, DataFileError) as exc:
        raise JobInputError(str(exc).strip("'\"")) from None
