"""Constrained beam search (`beam`) over an item trie, through the engine's beam hook."""

from __future__ import annotations

import random

import pytest
import torch

import laser
from laser.decoders.beam.search import Hyp, ItemTrie, beam_step, initial_beams

EOS = 1


def random_items(n: int, vocab: int, seed: int, length=(1, 5)) -> dict[str, list[int]]:
    rng = random.Random(seed)
    out: dict[str, list[int]] = {}
    while len(out) < n:
        seq = [rng.randrange(2, min(vocab, 12)) for _ in range(rng.randint(*length))]  # small alphabet: shared prefixes
        if seq not in out.values():
            out[f"i{len(out)}"] = seq
    return out


@torch.no_grad()
def full_log_probs(lm, context: list[int]) -> torch.Tensor:
    return torch.log_softmax(lm.model(torch.tensor([context])).logits[0, -1].float(), -1)


def naive_beam(lm, prompt: list[int], trie: ItemTrie, width: int) -> list[Hyp]:
    """Beam search with one plain forward per live beam (no tree, no cache): the reference."""
    hyps = initial_beams()
    while any(not h.done for h in hyps):
        rows = {h.seq: full_log_probs(lm, prompt + list(h.seq)) for h in hyps if not h.done}
        hyps = beam_step(hyps, rows, trie, width)
    return hyps


def exact_scores(lm, prompt: list[int], items: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for item, seq in items.items():
        full = seq + [EOS]
        out[item] = sum(float(full_log_probs(lm, prompt + full[:i])[full[i]]) for i in range(len(full)))
    return out


def test_item_trie_rules():
    trie = ItemTrie({"a": [5, 6], "b": [5, 7, 8], "c": [5]}, end_token=EOS)
    assert trie.allowed(()).tolist() == [5]
    assert trie.allowed((5,)).tolist() == [EOS, 6, 7]
    assert trie.item((5, EOS)) == "c" and trie.item((5,)) is None and len(trie) == 3
    with pytest.raises(ValueError, match="'a' and 'b' have the same identifier"):
        ItemTrie({"a": [3], "b": [3]}, end_token=EOS)
    with pytest.raises(ValueError, match="empty"):
        ItemTrie({}, end_token=EOS)
    with pytest.raises(ValueError, match="'x' has an empty identifier"):
        ItemTrie({"x": []}, end_token=EOS)


def test_full_width_ranks_every_item_exactly(tiny_lm):
    items = random_items(12, 96, seed=1)
    trie = ItemTrie(items, EOS)
    prompt = [5, 9, 13, 2, 40]
    rec = laser.get_decoder("beam", tiny_lm).recommend(prompt, trie, K=len(items))
    want = exact_scores(tiny_lm, prompt, items)
    assert [i for i, _ in rec.items] == sorted(want, key=lambda i: -want[i])
    for item, score in rec.items:
        assert score == pytest.approx(want[item], abs=1e-4)


@pytest.mark.parametrize("K", [1, 3, 5])
def test_beam_equals_naive_beam_search_in_a_batch(tiny_lm, K):
    items = random_items(30, 96, seed=2)
    trie = ItemTrie(items, EOS)
    prompts = [[7, 8, 9], [20, 21, 22, 23, 24, 25], [3]]
    dec = laser.get_decoder("beam", tiny_lm)
    recs = dec.recommend_batch(prompts, trie, K)
    for prompt, rec in zip(prompts, recs):
        ref = naive_beam(tiny_lm, prompt, trie, K)
        assert [i for i, _ in rec.items] == [trie.item(h.seq) for h in ref]
        assert [s for _, s in rec.items] == pytest.approx([h.score for h in ref], abs=1e-4)
        assert rec.stats.target_forwards == rec.beam_steps  # one step per forward


def test_bad_width_is_refused(tiny_lm):
    trie = ItemTrie({"a": [4], "b": [5]}, EOS)
    with pytest.raises(ValueError, match="K=3 is larger than the number of valid items \\(2\\)"):
        laser.get_decoder("beam", tiny_lm).recommend([4, 5], trie, K=3)
    with pytest.raises(ValueError, match="recommend_batch"):
        laser.get_decoder("beam", tiny_lm).generate([4, 5])
