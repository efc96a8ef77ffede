"""What a long-running server keeps per key a client names stays bounded (laser/vllm/sources.py): broken
stores, open stores, warned pool keys and unclaimed per-request statistics; 100,000 distinct names leave
resident memory flat."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import psutil
import pytest

from laser.vllm import sources
from laser.vllm.sources import REMEMBERED, STORE_CACHE, Bounded, StorePools


def test_bounded_forgets_the_least_recently_set():
    b: Bounded[str, int] = Bounded(3)
    for i, k in enumerate("abcd"):
        b[k] = i
    assert list(b) == ["b", "c", "d"]
    b["b"] = 9  # set again: the most recent now
    b["e"] = 5
    assert list(b) == ["d", "b", "e"]


class _Store:
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __contains__(self, key: object) -> bool:
        return False


def _opener(directory: str, tokenizer: object = None) -> _Store:
    if "missing" in directory:
        raise OSError(f"{directory}: no such store")
    return _Store(directory)


def test_100000_distinct_store_paths_leave_memory_flat(monkeypatch):
    monkeypatch.setattr(sources, "store_opener", lambda: _opener)
    monkeypatch.setattr(sources.log, "disabled", True)  # pytest keeps every record it captures
    pools = StorePools(lambda: object(), roots=[Path("/srv")])
    rss = psutil.Process(os.getpid()).memory_info().rss

    def burst(start: int) -> None:
        for i in range(start, start + 50_000):
            where = f"/srv/missing-{i}" if i % 2 else f"/srv/store-{i}"
            assert pools.get(where, f"key-{i}") is None  # no pool: the request decodes without drafts

    burst(0)
    gc.collect()
    after_first = psutil.Process(os.getpid()).memory_info().rss
    burst(50_000)
    gc.collect()
    after_second = psutil.Process(os.getpid()).memory_info().rss
    assert len(pools.broken) == REMEMBERED and len(pools.stores) == STORE_CACHE
    # the second 50,000 names add nothing: what is kept per name is bounded (a few MB of allocator noise)
    assert after_second - after_first < 8 * 2**20, (rss, after_first, after_second)


@pytest.mark.parametrize("cap", [1, 16])
def test_a_store_closed_by_the_lru_does_not_break_releasing_its_pools(monkeypatch, cap):
    class Store(_Store):
        released: list[object] = []

        def __contains__(self, key: object) -> bool:
            return True

        def get(self, key: object) -> object:
            return object()

        def release(self, key: object) -> None:
            Store.released.append(key)

    monkeypatch.setattr(sources, "store_opener", lambda: lambda d, tokenizer=None: Store(d))
    monkeypatch.setattr(sources, "STORE_CACHE", cap)
    pools = StorePools(lambda: object(), capacity=2, roots=[Path("/srv")])
    for i in range(40):
        assert pools.get(f"/srv/s{i % 20}", i) is not None
    assert len(pools.pools) == 2
