"""Token trie counts, temporary branches, and retrieval limits."""

from __future__ import annotations

import pickle
import random

import pytest

from pools import RetrievalPool, TokenTrie


def test_counts_are_window_occurrences():
    trie = TokenTrie(window=3)
    trie.extend([1, 2, 3, 1, 2, 4])
    assert trie.count([1]) == 2 and trie.count([1, 2]) == 2
    assert trie.count([1, 2, 3]) == 1 and trie.count([1, 2, 4]) == 1
    assert trie.count([2, 3, 1]) == 1 and trie.count([3, 1, 2, 4]) == 0  # beyond the window
    # nodes: 1,12,123,124,2,23,231,24,3,31,312,4
    assert len(trie) == 12


def test_growing_sequence_counts_each_window_once():
    whole, grown = TokenTrie(window=4), TokenTrie(window=4)
    seq = [5, 6, 7, 5, 6, 8, 5, 6, 7, 9]
    whole.extend(seq)
    previous = 0
    for end in (3, 4, 7, 10):
        grown.extend(seq[:end], old_len=previous)
        previous = end
    assert pickle.loads(pickle.dumps(whole))._trie == grown._trie
    assert len(whole) == len(grown)


def test_temporary_branches_vanish_after_the_request():
    pool = RetrievalPool.from_token_ids([[10, 11, 12, 13]])
    nodes = len(pool)
    drafter = pool.open([50, 51, 52, 53, 50, 51], max_nodes=8, n_max=2)
    tree = drafter.propose([50, 51])
    assert 52 in tree.tokens.tolist()  # drafted from the prompt (temporary)
    drafter.commit([60, 61])
    drafter.close()
    assert len(pool) == nodes
    fresh = pool.open([1, 2], max_nodes=8, n_max=2)
    assert fresh.propose([50, 51]).tokens.tolist() == [51]  # nothing temporary left anywhere


def test_temporary_before_permanent_and_generated_text_is_drafted():
    pool = RetrievalPool.from_token_ids([[7, 1, 1, 1]] * 5)  # permanent: 7 -> 1 seen 5 times
    drafter = pool.open([7, 2, 3], max_nodes=1, n_max=1)
    assert drafter.propose([9, 7]).tokens.tolist() == [7, 2]  # temporary continuation wins the one slot
    drafter.commit([7, 4])
    assert 4 in pool.retrieve([7], 4, 1, drafter.temporary).tokens.tolist()


def test_retrieval_respects_k_and_depth():
    seqs = [[1, *range(100 + 20 * i, 100 + 20 * i + 14)] for i in range(10)]
    pool = RetrievalPool.from_token_ids(seqs, window=13, max_depth=5)
    tree = pool.retrieve([1], max_nodes=16, n_max=1)
    assert len(tree) - 1 == 16
    assert tree.depth.max() <= 5
    assert len(pool.retrieve([1], max_nodes=64, n_max=1)) - 1 == 10 * 5  # ten branches of depth 5


def test_shorter_prefixes_tried_when_long_ones_find_little():
    pool = RetrievalPool.from_token_ids([[3, 4, 5, 6], [9, 4, 20, 21, 22, 23], [8, 4, 30, 31, 32]])
    # "3 4" continues with a single short branch; "4" alone has three branches.
    shortened = pool.retrieve([3, 4], max_nodes=16, n_max=2)  # 2 nodes < 0.25 * 16: shorten
    assert set(shortened.tokens[1:].tolist()) >= {20, 30, 5}
    pool.min_fraction = 0.1  # now a 2-node subtree is enough: the long prefix wins
    assert pool.retrieve([3, 4], max_nodes=16, n_max=2).tokens.tolist() == [4, 5, 6]


def test_eviction_bounds_the_trie():
    pool = RetrievalPool(window=4, max_trie_nodes=30)
    for i in range(20):
        pool.add([1, 2, 3, 100 + i, 200 + i])
    assert len(pool) <= 30
    assert pool.trie.count([1, 2, 3]) >= 1  # frequent branches survive


def test_min_prob_keeps_only_likely_continuations():
    # After "1": "2" 6 times, "3" twice, "4" once; "1 2" continues with "5" each time.
    pool = RetrievalPool.from_token_ids([[1, 2, 5]] * 6 + [[1, 3, 6]] * 2 + [[1, 4, 7]])
    assert len(pool.retrieve([1], max_nodes=16, n_max=1)) - 1 == 6
    likely = pool.retrieve([1], max_nodes=16, n_max=1, min_prob=0.2)  # 2/9 and 6/9 pass, 1/9 does not
    assert likely.tokens.tolist() == [1, 2, 5, 3, 6]
    assert pool.retrieve([1], max_nodes=16, n_max=1, min_prob=0.5).tokens.tolist() == [1, 2, 5]


def test_match_length_is_the_longest_suffix_retrieval_can_continue():
    """A drafter's match length is the longest suffix (up to n_max) that something followed in the pool or
    the request's own text, and retrieval drafts nothing exactly when it is 0."""
    rng = random.Random(0)
    for _ in range(200):
        pool = RetrievalPool.from_token_ids([[rng.randrange(6) for _ in range(12)] for _ in range(3)], window=5)
        prompt = [rng.randrange(9) for _ in range(rng.randrange(1, 10))]
        drafter = pool.open(prompt, max_nodes=8, n_max=3)
        generated = [rng.randrange(9) for _ in range(rng.randrange(0, 4))]
        drafter.commit(generated)
        context = prompt + generated
        match = drafter.match_length(context)
        continued = [
            n
            for n in range(1, min(3, len(context)) + 1)
            if pool.trie.top_subtree(context[-n:], 1, 1) or drafter.temporary.top_subtree(context[-n:], 1, 1)
        ]
        assert match == max(continued, default=0)
        assert (match == 0) == (len(drafter.propose(context)) == 1)


@pytest.mark.parametrize("cap", [None, 40])
def test_retrieval_after_a_match_gives_the_same_tree(cap):
    """Retrieval starts at the match length when it was just asked (longer prefixes continue nowhere): the
    trees are those of a retrieval that tries every prefix length, evicted pools included; a chain is the
    tree's first path, found without the tree."""
    rng = random.Random(1)
    for _ in range(150):
        texts = [[rng.randrange(5) for _ in range(rng.randrange(4, 30))] for _ in range(rng.randrange(1, 6))]
        pool = RetrievalPool.from_token_ids(texts, window=6, max_trie_nodes=cap)
        prompt = [rng.randrange(7) for _ in range(rng.randrange(1, 12))]
        asked, plain = pool.open(prompt, max_nodes=12, n_max=5), pool.open(prompt, max_nodes=12, n_max=5)
        context = list(prompt)
        for _ in range(4):
            asked.match_length(context)
            a, b = asked.propose(context), plain.propose(context)
            assert (a.tokens.tolist(), a.parents.tolist()) == (b.tokens.tolist(), b.parents.tolist())
            assert asked.propose_chain(context) == plain.propose_chain(context) == b.first_path()
            new = [rng.randrange(7) for _ in range(rng.randrange(1, 3))]
            context += new
            asked.commit(new)
            plain.commit(new)
