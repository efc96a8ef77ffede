"""Where a request's draft source comes from inside vLLM's engine process (the proposer's side of pools).

A request names its pool in its :class:`laser.vllm.request_args.LaserArgs` (``extra_args``):

- ``pool`` and ``pool_store``: the key of its routed pool in the pool store at that directory. The
  engine process opens each store once (through the opener of the ``laser.pool_stores`` entry-point
  group: ``laser`` never imports ``pools``) with the model's tokenizer, and keeps the pools it loaded in
  an LRU (:class:`StorePools`). This works wherever vLLM runs its engine core (in process or not).
- ``pool`` alone: a :class:`laser.drafting.DraftSource` registered in *this* process
  (:func:`register_source`): tests and benchmarks, with the engine core in process.
- neither: the request drafts from its own prompt and output (:class:`PromptLookup`), unless it says
  ``draft=False``.

A key found in neither place is not a silent fallback: the proposer counts it
(``LaserProposer.unknown_pools``), logs a warning once per key, and the request decodes without drafts.

A shared server trusts no path a client names: a store opens only inside the roots its operator lists in
``LASER_POOL_ROOTS`` (directories separated by ``os.pathsep``, read when the engine starts; none by
default, so no request opens a store until the operator says where they are). Whatever goes wrong while
opening or reading a store (outside the roots, missing, foreign, damaged, rebuilt in place, a bug) gives
that request no drafts and one warning per store; it never reaches vLLM's engine loop. A store rebuilt in
place is reopened at its next pool load (its pools already loaded stay as they were read).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from laser.drafting import DraftSource, Drafter
from laser.own_text import OwnText
from laser.tree import DraftTree

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

STORE_GROUP = "laser.pool_stores"  # entry points: name -> callable(directory, tokenizer=...) -> a pool store
STORE_OPENER = "pools"  # the entry point used when several are installed
POOL_CACHE = 64  # pools kept loaded per proposer (LRU by store and key)
STORE_CACHE = 16  # pool stores kept open per proposer (LRU by directory)
REMEMBERED = 4096  # per-key records a server keeps (broken stores, warned keys, unclaimed statistics)
ROOTS_ENV = "LASER_POOL_ROOTS"  # the directories request pool stores may lie in (os.pathsep-separated)

K = TypeVar("K")
V = TypeVar("V")


class Bounded(OrderedDict[K, V]):
    """A dict that forgets its least recently set entries beyond ``capacity``: what a server keeps per key
    a client names stays bounded however many keys clients name."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class PoolStore(Protocol):
    """What a pool-store opener returns (``pools.store`` implements it; ``laser`` never imports it)."""

    def __contains__(self, key: object) -> bool: ...

    def get(self, key: Hashable) -> DraftSource: ...

    def changed(self) -> bool: ...


StoreOpener = Callable[..., PoolStore]  # opener(directory, tokenizer=tokenizer)

_SOURCES: dict[Hashable, DraftSource] = {}
_LOCK = threading.Lock()


def register_source(key: Hashable, source: DraftSource) -> None:
    """Make ``source`` the pool of requests whose key is ``key`` in this process (replaces an earlier one)."""
    with _LOCK:
        _SOURCES[key] = source


def unregister_source(key: Hashable) -> None:
    with _LOCK:
        _SOURCES.pop(key, None)


def registered_keys() -> list[Hashable]:
    with _LOCK:
        return list(_SOURCES)


def get_source(key: Hashable) -> DraftSource | None:
    """The source registered in this process under ``key``, or None."""
    with _LOCK:
        return _SOURCES.get(key)


def store_opener() -> StoreOpener:
    """The pool-store opener installed under the ``laser.pool_stores`` entry-point group.

    It is called as ``opener(directory, tokenizer=tokenizer)`` and returns a store with ``key in store``,
    ``store.get(key)`` (a :class:`laser.drafting.DraftSource`) and ``store.release(key)``.
    """
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=STORE_GROUP)}
    if not found:
        raise RuntimeError(
            f"no pool-store opener is installed (entry-point group {STORE_GROUP!r} is empty): "
            "install the project (pip install -e . or its wheel; laser submit ships the wheel to a Ray cluster) to open "
            "pool stores in vLLM's engine process"
        )
    if len(found) > 1 and STORE_OPENER not in found:
        raise RuntimeError(
            f"several pool-store openers are installed ({sorted(found)}) and none is named {STORE_OPENER!r}"
        )
    opener: StoreOpener = (found.get(STORE_OPENER) or next(iter(found.values()))).load()
    return opener


def pool_roots(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The directories request pool stores may lie in: ``LASER_POOL_ROOTS``, links resolved (none: no store opens)."""
    raw = (os.environ if env is None else env).get(ROOTS_ENV, "")
    return tuple(Path(os.path.realpath(p)) for p in raw.split(os.pathsep) if p.strip())


def add_pool_roots(roots: Sequence[str | os.PathLike[str]]) -> tuple[Path, ...]:
    """Add ``roots`` to ``LASER_POOL_ROOTS`` of this process (and the engine processes it starts); returns all."""
    known = [str(r) for r in pool_roots()]
    more = [os.path.realpath(r) for r in roots if os.path.realpath(r) not in known]
    if more:
        os.environ[ROOTS_ENV] = os.pathsep.join(known + more)
    return pool_roots()


def within(directory: str | os.PathLike[str], roots: Sequence[Path]) -> bool:
    """Whether ``directory`` (links and ``..`` resolved) is one of ``roots`` or lies under one."""
    real = Path(os.path.realpath(directory))
    return any(real == root or root in real.parents for root in roots)


class StorePools:
    """Pool stores opened by directory (once each) and their pools loaded by key (an LRU of ``capacity``).

    Args:
        tokenizer: returns the model's tokenizer (called once, at the first store opened); the store
            checks its pools were built with the same one.
        capacity: pools kept loaded; the least recently used is released beyond it.
        roots: the directories stores may lie in (default: :func:`pool_roots`); :meth:`trust` adds one.
    """

    def __init__(
        self, tokenizer: Callable[[], object], capacity: int = POOL_CACHE, roots: Sequence[Path] | None = None
    ) -> None:
        self.roots = list(pool_roots() if roots is None else roots)
        self._tokenizer_fn: Callable[[], object] = tokenizer
        self._tokenizer: object = None
        self.capacity = capacity
        self.stores: Bounded[str, PoolStore] = Bounded(STORE_CACHE)
        self.pools: OrderedDict[tuple[str, Hashable], DraftSource] = OrderedDict()
        self.loads = 0  # pools loaded from a store (misses of the LRU)
        self.broken: Bounded[str, str] = Bounded(REMEMBERED)  # directory -> why it could not be opened
        self._opener: StoreOpener | None = None

    def trust(self, directory: str | os.PathLike[str]) -> None:
        """Let requests open the store at ``directory`` (the engine's owner submits its own stores' pools)."""
        if not within(directory, self.roots):
            self.roots.append(Path(os.path.realpath(directory)))
            self.broken.pop(os.fspath(directory), None)

    def store(self, directory: str) -> PoolStore | None:
        """The store at ``directory``, opened once (again when it was rebuilt); None (logged once) when it cannot
        be opened: a request naming a store outside the roots, missing or foreign decodes without drafts."""
        store = self.stores.get(directory)
        if store is not None and not _changed(store):
            return store
        if directory in self.broken:
            return None
        try:
            if not within(directory, self.roots):
                raise PermissionError(
                    f"outside the pool-store roots ({ROOTS_ENV}: {os.pathsep.join(map(str, self.roots)) or 'none set'})"
                )
            if self._opener is None:
                self._opener = store_opener()
            if self._tokenizer is None:
                self._tokenizer = self._tokenizer_fn()
            store = self._opener(directory, tokenizer=self._tokenizer)
        except Exception as exc:  # whatever a client's path holds, never vLLM's engine loop
            self._broke(directory, exc)
            return None
        self.stores[directory] = store
        log.info("opened pool store %s", directory)
        return store

    def get(self, where: str | os.PathLike[str], key: Hashable) -> DraftSource | None:
        """Pool ``key`` of the store at ``where`` (a directory), or None if the store has no such pool or cannot
        be read (logged once per store)."""
        directory = os.fspath(where)
        pool = self.pools.get((directory, key))
        if pool is not None:
            self.pools.move_to_end((directory, key))
            return pool
        pool = self._load(directory, key)
        if pool is None:
            return None
        self.loads += 1
        self.pools[(directory, key)] = pool
        while len(self.pools) > self.capacity:
            (old_dir, old_key), _ = self.pools.popitem(last=False)
            release = getattr(self.stores.get(old_dir), "release", None)  # its store may be closed already
            if release is not None:
                release(old_key)
        return pool

    def _load(self, directory: str, key: Hashable) -> DraftSource | None:
        """Pool ``key`` read from its store; a store rebuilt while it was read is reopened and read once more."""
        for attempt in range(2):
            store = self.store(directory)
            if store is None:
                return None
            try:
                return store.get(key) if key in store else None
            except Exception as exc:  # a damaged or half-replaced store: this request drafts without it
                self.stores.pop(directory, None)
                if attempt or not _changed(store):
                    self._broke(directory, exc)
        return None

    def _broke(self, directory: str, exc: Exception) -> None:
        self.broken[directory] = f"{type(exc).__name__}: {exc}"
        log.warning("pool store %s cannot be used (%s): its requests decode without drafts", directory, exc)


def _changed(store: PoolStore) -> bool:
    """Whether ``store`` was rebuilt since it was opened (stores without ``changed`` never are)."""
    changed = getattr(store, "changed", None)
    try:
        return bool(changed()) if changed is not None else False
    except Exception:
        return True


class PromptLookup:
    """A draft source with no earlier knowledge: n-gram matches in the request's own prompt and output.

    Drafts the continuation of the latest earlier occurrence of the longest suffix (``n_max`` down to
    1 token) of the context. Used for requests that name no pool (and do not say ``draft: False``).
    """

    def open(self, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float) -> Drafter:
        return _LookupDrafter(list(prompt_ids), n_max)


class _LookupDrafter(Drafter):
    def __init__(self, prompt: list[int], n_max: int) -> None:
        self.text, self.n_max = OwnText(max(2, n_max), prompt), n_max

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        return DraftTree.chain(context[-1], self.propose_chain(context, budget))

    def propose_chain(self, context: Sequence[int], budget: int | None = None) -> list[int]:
        return self.text.latest_follow(self.n_max, 8 if budget is None else budget)

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self.text.extend(new_tokens)

    def match_length(self, context: Sequence[int]) -> int:
        return self.text.match_length(self.n_max)
