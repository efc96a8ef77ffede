"""Package faces that load on first use (PEP 562): ``from laser import load_model`` imports
:mod:`laser.models` only then, and ``laser.models`` after a bare ``import laser`` is the submodule,
imported on demand. Importing one light module of a package (a parser, a check) loads nothing else.

A name that is also a submodule's (``laser.vllm.request_args``, the function and its module) is bound at
once: importing the submodule would set the package's attribute of that name to the module."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``homes`` (name -> defining module) or a
    submodule, imported the first time it is read and kept as a plain attribute after. A name of ``homes`` that
    is also a submodule's is bound now."""
    face = sys.modules[package]
    for name, home in homes.items():
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            setattr(face, name, getattr(importlib.import_module(home), name))

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(face, name, value)
        return value

    return __getattr__
