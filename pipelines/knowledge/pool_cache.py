"""A worker's pools: the pool store a task names, and an LRU of the pools loaded from it."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pipelines.knowledge.records import DecodeTask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pools import RetrievalPool
    from pools.store import PoolStore


class PoolCache:
    """Pools of one pool store by key, an LRU of ``task.pool_cache_size`` loaded pools (the store is
    reopened when a task names another)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.store: PoolStore | None = None
        self.pools: OrderedDict[str, RetrievalPool] = OrderedDict()
        self.loads = 0

    def has(self, task: DecodeTask, key: str | None) -> bool:
        """Whether the task's store holds pool ``key`` (a group without old knowledge has none)."""
        return key is not None and key in self._store(task, key)

    def get(self, task: DecodeTask, key: str | None) -> RetrievalPool | None:
        """Pool ``key`` (None: no pool), loaded on a miss; the least recently used one leaves past the size."""
        if key is None or not self.has(task, key):
            return None
        if key in self.pools:
            self.pools.move_to_end(key)
            return self.pools[key]
        store = self._store(task, key)
        pool = self.pools[key] = store.get(key)
        self.loads += 1
        while len(self.pools) > task.pool_cache_size:
            evicted, _ = self.pools.popitem(last=False)
            store.release(evicted)
        return pool

    def _store(self, task: DecodeTask, key: str) -> PoolStore:
        if self.store is None or str(self.store.directory) != str(task.pool_store):
            if task.pool_store is None:
                raise ValueError(f"request needs pool {key!r} but the task has no pool store")
            from pools.store import PoolStore

            self.store = PoolStore.open(task.pool_store, tokenizer=self.tokenizer)
            self.pools.clear()
        return self.store
