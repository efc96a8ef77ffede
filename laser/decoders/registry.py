"""Decoders by name: the built-ins plus third-party ones from the ``laser.decoders`` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, TypeVar

from laser.decoders.base import Decoder
from laser.decoder_card import DecoderCard, DecoderChoice
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


def get_decoder(name: str, lm: LoadedModel, **params: Any) -> Decoder:
    """Instantiate the decoder called ``name`` for model ``lm``."""
    known = available_decoders()
    if name not in known:
        raise ValueError(f"unknown decoder {name!r}; known decoders: {', '.join(known)}")
    try:
        return known[name](lm, **params)
    except TypeError as err:
        raise ValueError(f"bad parameters for decoder {name!r}: {err}") from err


def resolve_decoder(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    key: str = "decoder",
    model: str | None = None,
    produces: str | None = None,
) -> DecoderChoice:
    """The decoder called ``name`` with ``params`` checked by the class itself (``Decoder.check_params``);
    every error is a ``ValueError`` whose message starts with the config ``key`` it is about. ``model`` is
    the target; ``produces`` (``"text"`` or ``"ranking"``) refuses a decoder that makes the other kind."""
    known = available_decoders()
    if name not in known:
        raise ValueError(f"{key}.name: unknown decoder {name!r}; available: {sorted(known)}")
    cls = known[name]
    if produces is not None and cls.produces != produces:
        makes = sorted(n for n, c in known.items() if c.produces == produces)
        raise ValueError(
            f"{key}.name: decoder {name!r} produces a {cls.produces}, not a {produces}; choose one of {makes}"
        )
    try:
        checked = cls.check_params(dict(params or {}), model)
    except ValueError as exc:
        raise ValueError(f"{key}.{exc}") from None
    return DecoderChoice(DecoderCard.of(cls), checked)
