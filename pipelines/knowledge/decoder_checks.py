"""Decoder checks a job remembers, so that a scheduled run starts its workers before the decoding stack loads.

Checking a decoder's parameters builds it once on a tiny model (:meth:`laser.decoders.base.Decoder.probe`),
which imports torch and transformers: about 10 s of a 2-core driver's start, before Ray and the workers
could start. A check that passed is remembered in the cache directory (``$LASER_CACHE_DIR``), under a stamp
of the code that decided it (this package's files and the decoder plug-ins' distributions): the same decoder,
parameters, model and sampling on the same code read the verdict back, and the registered decoders' cards
with it. A failed check is never remembered, nor one of a decoder that loads artefacts of its own (a draft model, a
head); a change to any file of the package checks again.
Only decoders of this package and of installed plug-ins are remembered (not classes registered at run time).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

from laser.decoder_card import DecoderCard, DecoderChoice
from laser.files import atomic_write
from laser.models import cache_dir

log = logging.getLogger(__name__)

PLUGIN_GROUP = "laser.decoders"  # the entry-point group of decoder plug-ins (laser/decoders/registry.py)


def checks_path() -> Path:
    return cache_dir() / "decoder-checks.json"


def code_stamp() -> str:
    """A digest of what decides a check: every file of the ``laser`` package (path, size, modification
    time) and the decoder plug-ins (entry point and distribution version). Reads no file's contents."""
    digest = hashlib.sha256()
    spec = importlib.util.find_spec("laser")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(root).rglob("*.py")):
            st = path.stat()
            digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for ep in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        version = ep.dist.version if ep.dist is not None else ""
        digest.update(f"{ep.name}={ep.value}@{version}\n".encode())
    return digest.hexdigest()


def _read(stamp: str) -> dict[str, Any]:
    try:
        saved = json.loads(checks_path().read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) and saved.get("stamp") == stamp else {}


def _write(saved: dict[str, Any]) -> None:
    try:
        atomic_write(checks_path(), lambda tmp: Path(tmp).write_text(json.dumps(saved, default=str)))
    except OSError as exc:  # a read-only cache: the next run checks again
        log.debug("decoder checks not remembered: %s", exc)


def _rememberable(card: DecoderCard, plugins: set[str]) -> bool:
    return card.home.startswith("laser.") or card.name in plugins


def _plugins() -> set[str]:
    return {ep.name for ep in metadata.entry_points(group=PLUGIN_GROUP)}


def cards() -> dict[str, DecoderCard]:
    """Every registered decoder's card: remembered, or read from the registry (which imports the decoders)."""
    stamp = code_stamp()
    saved = _read(stamp)
    if "cards" in saved:
        return {name: DecoderCard.from_json(card) for name, card in saved["cards"].items()}
    from laser.decoders.registry import available_decoders

    known = {name: DecoderCard.of(cls) for name, cls in available_decoders().items()}
    plugins = _plugins()
    saved = {
        **_read(stamp),
        "stamp": stamp,
        "cards": {n: c.as_json() for n, c in known.items() if _rememberable(c, plugins)},
    }
    _write(saved)
    return known


def _key(name: str, params: dict[str, Any], model: str | None, produces: str, sampling: Any) -> str:
    return json.dumps([name, params, model, produces, sampling], sort_keys=True, default=str)


def recall(name: str, params: dict[str, Any], model: str | None, produces: str, sampling: Any) -> DecoderChoice | None:
    """The remembered choice of a check that passed with these inputs on this code, or None."""
    saved = _read(code_stamp())
    hit = saved.get("verdicts", {}).get(_key(name, params, model, produces, sampling))
    if not isinstance(hit, dict):
        return None
    return DecoderChoice(DecoderCard.from_json(hit["card"]), hit["params"])


def remember(
    choice: DecoderChoice, name: str, params: dict[str, Any], model: str | None, produces: str, sampling: Any
) -> None:
    """Keep a check that passed: of a decoder of this package or of an installed plug-in, that loads no
    artefact of its own (``requires``: a draft model or a head can change under the same code), and whose
    checked parameters read back from JSON as they are (a tuple or a path would come back another type)."""
    if (
        not _rememberable(choice.card, _plugins())
        or choice.card.requires
        or json.loads(json.dumps(choice.params, default=str)) != choice.params
    ):
        return
    stamp = code_stamp()
    saved = {"stamp": stamp, **_read(stamp)}
    verdicts = dict(saved.get("verdicts", {}))
    verdicts[_key(name, params, model, produces, sampling)] = {"card": choice.card.as_json(), "params": choice.params}
    _write({**saved, "verdicts": verdicts})
