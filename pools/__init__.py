"""Token-trie retrieval pools (pygtrie): drafting from earlier knowledge, pool building and storage."""

from pools.retrieval import PoolDrafter, RetrievalPool
from pools.trie import TokenTrie

__all__ = ["PoolDrafter", "RetrievalPool", "TokenTrie"]
