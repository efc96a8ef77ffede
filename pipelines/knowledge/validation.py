"""Input validation before a job creates anything: the dataset files (decoders: pipelines/knowledge/decoders.py).

Errors are :class:`JobInputError` with a one-line message naming the config key or the file; the CLI
prints it and exits with code 2, as it does for config-schema errors.
"""

from __future__ import annotations

import logging
from typing import Callable, ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class JobInputError(ValueError):
    """A job input (decoder, decoder parameter, dataset file) that cannot work; the message names it."""


def load_inputs(load: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``load(*args)`` with a missing or unreadable data file turned into a :class:`JobInputError`."""
    from pipelines.data.readers import DataFileError

    try:
        return load(*args, **kwargs)
    except (FileNotFoundError, DataFileError) as exc:
        raise JobInputError(str(exc).strip("'\"")) from None
