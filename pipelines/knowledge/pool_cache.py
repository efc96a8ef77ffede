"""A worker's pools: the pool store a task names, an LRU of the pools loaded from it, and the pools that
grow in the worker as it writes (groups with no earlier knowledge, ``task.online_pools``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from pipelines.knowledge.records import DecodeTask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pools import RetrievalPool
    from pools.store import PoolStore


class PoolCache:
    """Pools of one pool store by key, an LRU of ``task.pool_cache_size`` loaded pools (the store is
    reopened when a task names another).

    With ``task.online_pools``, a group the store has no pool for gets one here, empty at first: every text
    the worker writes for the group is added to it (:meth:`grow`), so the group's later entities, and the
    ones still decoding, draft from the texts written before them, up to ``task.pool_max_size`` texts (as
    the store's pools). They live as long as the worker, one set per pass's run id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.store: PoolStore | None = None
        self.pools: OrderedDict[str, RetrievalPool] = OrderedDict()
        self.online: dict[tuple[str, str], RetrievalPool] = {}  # (run id, key) -> a pool growing here
        self.loads = 0

    def has(self, task: DecodeTask, key: str | None) -> bool:
        """Whether the request of group ``key`` drafts from a pool: the store's, or one growing here."""
        return key is not None and (key in self._store(task, key) or task.online_pools)

    def is_online(self, task: DecodeTask, key: str | None) -> bool:
        """Whether group ``key``'s pool is one growing in this worker (not the store's)."""
        return key is not None and task.online_pools and key not in self._store(task, key)

    def get(self, task: DecodeTask, key: str | None) -> RetrievalPool | None:
        """Pool ``key`` (None: no pool), loaded on a miss; the least recently used one leaves past the size."""
        if key is None or not self.has(task, key):
            return None
        if self.is_online(task, key):
            return self._online(task, key)
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

    def grow(self, task: DecodeTask, key: str | None, text: str | Sequence[int]) -> None:
        """Add a text the worker wrote for group ``key`` to the group's pool when it grows here."""
        if not text or not self.is_online(task, key):
            return
        pool = self._online(task, key)  # type: ignore[arg-type]  # is_online: key is a str
        if pool.texts < task.pool_max_size:  # as the store's pools: a group's first texts, at most so many
            pool.add(self.tokenizer(text, add_special_tokens=False)["input_ids"] if isinstance(text, str) else text)

    def _online(self, task: DecodeTask, key: str) -> RetrievalPool:
        pool = self.online.get((task.run_id, key))
        if pool is None:
            from pools import RetrievalPool

            pool = self.online[(task.run_id, key)] = RetrievalPool()
        return pool

    def _store(self, task: DecodeTask, key: str) -> PoolStore:
        if self.store is None or str(self.store.directory) != str(task.pool_store):
            if task.pool_store is None:
                raise ValueError(f"request needs pool {key!r} but the task has no pool store")
            from pools.store import PoolStore

            self.store = PoolStore.open(task.pool_store, tokenizer=self.tokenizer)
            self.pools.clear()
        return self.store
