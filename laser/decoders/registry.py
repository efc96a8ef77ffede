"""Decoders by name: the built-ins plus third-party ones from the ``laser.decoders`` entry-point group."""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import TypeVar

from laser.decoders.base import Decoder
from laser.models import LoadedModel

_REGISTRY: dict[str, type[Decoder]] = {}
D = TypeVar("D", bound=type[Decoder])


def register_decoder(cls: D) -> D:
    """Class decorator: make a Decoder subclass available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def _load_plugins() -> None:
    for ep in entry_points(group="laser.decoders"):
        if ep.name not in _REGISTRY:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Decoder)):
                raise TypeError(f"entry point laser.decoders:{ep.name} ({ep.value}) is not a laser Decoder subclass")
            _REGISTRY.setdefault(ep.name, cls)


def available_decoders() -> dict[str, type[Decoder]]:
    """Every registered decoder by name, entry-point plug-ins included."""
    _load_plugins()
    return dict(sorted(_REGISTRY.items()))


def get_decoder(name: str, lm: LoadedModel, **params) -> Decoder:
    """Instantiate the decoder called ``name`` for model ``lm``."""
    known = available_decoders()
    if name not in known:
        raise ValueError(f"unknown decoder {name!r}; known decoders: {', '.join(known)}")
    try:
        return known[name](lm, **params)
    except TypeError as err:
        raise ValueError(f"bad parameters for decoder {name!r}: {err}") from err
