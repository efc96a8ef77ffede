"""A request's own text as an n-gram index answers exactly what a token trie of it answers."""

import random

import pytest

from laser.own_text import INDEXED, SCAN, OwnText
from pools.trie import TokenTrie


def _grown(tokens, window, longest, rng):
    """The same text fed to a trie and an index in the same random pieces (as an engine feeds a row)."""
    trie, index, old = TokenTrie(window), OwnText(window, longest=longest), 0
    for cut in sorted(rng.sample(range(len(tokens) + 1), min(3, len(tokens) + 1))) + [len(tokens)]:
        trie.extend(tokens[:cut], old)
        index.extend(tokens[old:cut])
        old = cut
    return trie, index


@pytest.mark.parametrize("seed", range(4))
def test_counts_and_continuations_match_the_trie(seed):
    rng = random.Random(seed)
    for _ in range(60):
        vocab, window = rng.choice([2, 3, 5, 20]), rng.choice([2, 3, 5, 13])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
        trie, index = _grown(tokens, window, rng.randrange(1, window + 1), rng)
        for _ in range(20):
            n = rng.randrange(1, window + 2)  # keys longer than the window included
            prefix = tokens[-n:] if rng.random() < 0.7 else [rng.randrange(vocab) for _ in range(n)]
            limit, depth, min_prob = rng.randrange(1, 20), rng.randrange(0, 14), rng.choice([0.0, 0.1, 0.3])
            assert index.count(prefix) == trie.count(prefix)
            assert index.top_subtree(prefix, limit, depth, min_prob) == trie.top_subtree(prefix, limit, depth, min_prob)


def test_ties_go_to_the_continuation_seen_first():
    index = OwnText(5, [1, 7, 1, 3, 1, 3, 1, 7, 1])
    assert index.top_subtree([1], 2, 1) == [((7,), 2), ((3,), 2)]


def _scan(tokens, n_max, limit):
    """Prompt lookup by brute force: the suffix length matched and what followed its latest earlier
    occurrence."""
    for n in range(min(n_max, len(tokens) - 1), 0, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                return n, tokens[start + n : start + n + limit]
    return 0, []


@pytest.mark.parametrize("seed", range(2))
def test_latest_follow_is_prompt_lookup(seed):
    rng = random.Random(seed)
    for _ in range(200):
        tokens = [rng.randrange(rng.choice([2, 3, 6])) for _ in range(rng.randrange(1, 60))]
        n_max, limit = rng.randrange(1, 6), rng.randrange(1, 6)
        index = OwnText(max(2, n_max), tokens, longest=rng.randrange(1, n_max + 1))
        assert (index.match_length(n_max), index.latest_follow(n_max, limit)) == _scan(tokens, n_max, limit)


def _longest_suffix(text, context, n_max):
    """By brute force: the longest suffix of ``context`` (<= n_max) occurring in ``text`` with a token after it,
    and every end of its occurrences."""
    for n in range(min(n_max, len(context)), 0, -1):
        ends = [e for e in range(n, len(text)) if text[e - n : e] == list(context[-n:])]
        if ends:
            return n, ends
    return 0, []


@pytest.mark.parametrize("seed", range(3))
def test_suffix_match_beyond_the_index_is_the_longest_suffix(seed):
    rng = random.Random(seed)
    for _ in range(300):
        vocab = rng.choice([2, 3, 8])
        text = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        context = text[: rng.randrange(len(text) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        n_max = rng.randrange(1, 16)  # past INDEXED: extended backwards
        index = OwnText(max(2, n_max + 1), text, longest=n_max)
        want = _longest_suffix(text, context, n_max)
        if len(want[1]) <= SCAN:  # more occurrences than that: the latest SCAN only
            assert index.suffix_match(context, n_max) == want


def test_a_request_s_index_and_lookups_are_bounded_whatever_its_text():
    """A 6,000-token text asked 32 deep indexes at most INDEXED keys a token, and a suffix match on a text of
    one token repeated checks at most SCAN occurrences."""
    rng = random.Random(0)
    text = [rng.randrange(50_000) for _ in range(6000)]
    assert len(OwnText(33, text, longest=32)._ends) <= INDEXED * len(text)
    same = OwnText(33, [7] * 6000, longest=32)
    n, ends = same.suffix_match([7] * 40, 32)
    assert n == 32 and len(ends) == SCAN and ends[-1] == 5999  # the latest occurrences, a token after each
