"""Token-trie retrieval pools (pygtrie): drafting from earlier knowledge, pool building and storage."""
