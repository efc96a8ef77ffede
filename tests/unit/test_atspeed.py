"""`atspeed` strict top-K verification: exactly `beam`'s ranked items and scores, for any draft, gamma, N."""

from __future__ import annotations

import pytest

import laser
from laser.decoders.beam.search import ItemTrie
from test_beam_recommend import EOS, random_items

PROMPTS = [[7, 8, 9, 10], [20, 21, 22, 23, 24, 25], [3, 4]]


@pytest.fixture(scope="module")
def setup(tiny_lm):
    trie = ItemTrie(random_items(40, 96, seed=5, length=(2, 6)), EOS)
    refs = {K: laser.get_decoder("beam", tiny_lm).recommend_batch(PROMPTS, trie, K) for K in (3, 5)}
    return trie, refs


def drafts(tiny_lm):
    return {"self": tiny_lm, "truncate:1": "truncate:1", "random": laser.tiny_llama(vocab_size=96, seed=11)}


@pytest.mark.parametrize("draft", ["self", "truncate:1", "random"])
@pytest.mark.parametrize("gamma,N,K", [(1, 5, 5), (3, 5, 3), (4, 12, 5)])
def test_strict_equals_beam(tiny_lm, setup, draft, gamma, N, K):
    trie, refs = setup
    dec = laser.get_decoder("atspeed", tiny_lm, draft=drafts(tiny_lm)[draft], gamma=gamma, N=N)
    for got, want in zip(dec.recommend_batch(PROMPTS, trie, K), refs[K]):
        assert [i for i, _ in got.items] == [i for i, _ in want.items]
        assert [s for _, s in got.items] == pytest.approx([s for _, s in want.items], abs=1e-4)
        assert got.beam_steps == want.beam_steps  # the same search, in fewer forwards
        steps = got.stats.target_forwards
        assert want.beam_steps / (gamma + 1) <= steps <= want.beam_steps


def test_draft_equal_to_target_accepts_every_step(tiny_lm, setup):
    trie, refs = setup
    gamma = 3
    dec = laser.get_decoder("atspeed", tiny_lm, draft=tiny_lm, gamma=gamma, N=5)
    for got in dec.recommend_batch(PROMPTS, trie, 5):
        # every forward but the last advances gamma + 1 steps
        assert got.stats.target_forwards == -(-got.beam_steps // (gamma + 1))


def test_bad_parameters(tiny_lm, setup):
    trie, _ = setup
    with pytest.raises(ValueError, match="N=2 draft beams cannot cover K=3"):
        laser.get_decoder("atspeed", tiny_lm, draft="truncate:1", N=2).recommend([5, 6], trie, 3)
    with pytest.raises(ValueError, match="gamma and N must be >= 1"):
        laser.get_decoder("atspeed", tiny_lm, draft="truncate:1", gamma=0)
