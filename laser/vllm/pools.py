"""Draft sources by key, in this process: how a request's pool key (``extra_args["laser"]["pool"]``)
reaches its pool inside vLLM's model runner.

A key names a :class:`laser.drafting.DraftSource` (e.g. a ``pools.RetrievalPool``); an unknown or
missing key drafts from the request's own prompt and output only (:class:`PromptLookup`).
"""
from __future__ import annotations

import threading
from typing import Hashable, Sequence

from laser.drafting import DraftSource, Drafter
from laser.tree import DraftTree

_SOURCES: dict[Hashable, DraftSource] = {}
_LOCK = threading.Lock()


def register_source(key: Hashable, source: DraftSource) -> None:
    """Make ``source`` the pool of requests whose key is ``key`` (replaces an earlier one)."""
    with _LOCK:
        _SOURCES[key] = source


def unregister_source(key: Hashable) -> None:
    with _LOCK:
        _SOURCES.pop(key, None)


def registered_keys() -> list[Hashable]:
    with _LOCK:
        return list(_SOURCES)


def get_source(key: Hashable | None) -> DraftSource:
    if key is not None:
        source = _SOURCES.get(key)
        if source is not None:
            return source
    return PromptLookup()


class PromptLookup:
    """A draft source with no earlier knowledge: n-gram matches in the request's own prompt and output.

    Drafts the continuation of the latest earlier occurrence of the longest suffix (``n_max`` down to
    1 token) of the context.
    """

    def open(self, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float) -> Drafter:
        return _LookupDrafter(list(prompt_ids), n_max)


class _LookupDrafter(Drafter):
    def __init__(self, context: list[int], n_max: int):
        self.context, self.n_max = context, n_max

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        ctx = list(context)
        want = 8 if budget is None else budget
        for n in range(min(self.n_max, len(ctx) - 1), 0, -1):
            suffix = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start:start + n] == suffix:
                    follow = ctx[start + n:start + n + want]
                    if follow:
                        return DraftTree.chain(ctx[-1], follow)
        return DraftTree.chain(ctx[-1])
