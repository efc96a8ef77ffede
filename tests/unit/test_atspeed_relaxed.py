"""AtSpeed-R relaxed sampling verification: the notes' invariants, by chi-square where the rule is exact,
each shown to fail when the residual rule is broken."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import laser
from laser.decoders.beam.search import ItemTrie
from laser.decoders.beam.relaxed import RelaxedBeamVerifier, relaxed_accept, sample_distinct
from test_beam_recommend import EOS, full_log_probs

P = np.array([0.4, 0.3, 0.2, 0.1])
Q = np.array([0.1, 0.2, 0.3, 0.4])
TVD = 0.5 * np.abs(P - Q).sum()


def draws(K: int, N: int, n: int, q: np.ndarray = Q, broken: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sets, first_ok = [], 0
    for _ in range(n):
        drafted = sample_distinct(q, N, g)
        chosen, _ = relaxed_accept(P, q, drafted, K, g, broken)
        sets.append(tuple(sorted(chosen)))
        first_ok += drafted[0] in chosen
    return sets, first_ok / n


def test_one_beam_one_draft_is_speculative_sampling():
    n = 6000
    good, _ = draws(1, 1, n)
    bad, _ = draws(1, 1, n, broken=True)
    counts = lambda sets: np.bincount([s[0] for s in sets], minlength=4)  # noqa: E731
    assert chisquare(counts(good), P * n).pvalue > 1e-3
    assert chisquare(counts(bad), P * n).pvalue < 1e-6


def test_per_candidate_acceptance_is_one_minus_tvd():
    n = 6000
    g = torch.Generator().manual_seed(1)
    accepted = 0
    for _ in range(n):
        y = sample_distinct(Q, 1, g)
        chosen, ok = relaxed_accept(P, Q, y, 1, g)
        accepted += ok
    assert accepted / n == pytest.approx(1 - TVD, abs=4 * np.sqrt(0.25 / n))


def test_q_equal_p_accepts_and_keeps_the_target_beam_distribution():
    """q = p and N = K: every draft accepted, and the K-set is distributed as the target's K draws."""
    n, K = 6000, 2
    g = torch.Generator().manual_seed(2)
    pairs = list(itertools.combinations(range(4), 2))
    exact = np.zeros(len(pairs))
    for i, (a, b) in enumerate(pairs):  # successive sampling without replacement
        exact[i] = P[a] * P[b] / (1 - P[a]) + P[b] * P[a] / (1 - P[b])
    got = np.zeros(len(pairs))
    for _ in range(n):
        chosen, ok = relaxed_accept(P, P, sample_distinct(P, K, g), K, g)
        assert ok
        got[pairs.index(tuple(sorted(chosen)))] += 1
    assert chisquare(got, exact * n).pvalue > 1e-3


# ---- on a toy model, through the decoder ---------------------------------------------------------

ITEMS = {"a": [4, 5], "b": [4, 6], "c": [7], "d": [7, 8, 9], "e": [10]}


def exact_item_probs(lm, prompt, trie: ItemTrie) -> dict[str, float]:
    """K = 1 sampling beam search = ancestral sampling renormalised over the allowed tokens."""
    out = {}
    for item, seq in ITEMS.items():
        full, prob = seq + [EOS], 1.0
        for i in range(len(full)):
            lp = full_log_probs(lm, prompt + full[:i])
            allowed = trie.allowed(tuple(full[:i]))
            prob *= float(torch.softmax(lp[allowed], 0)[allowed.tolist().index(full[i])])
        out[item] = prob
    return out


@pytest.mark.slow
def test_relaxed_decoder_with_K_N_1_samples_items_from_the_target():
    lm = laser.tiny_llama(vocab_size=96, seed=3, logit_scale=1.0)  # flat: every item is likely
    draft = laser.tiny_llama(vocab_size=96, seed=12, logit_scale=8.0)  # peaked and unlike the target
    trie, prompt, n = ItemTrie(ITEMS, EOS), [11, 12, 13], 300
    exact = exact_item_probs(lm, prompt, trie)
    names = sorted(ITEMS)
    dec = laser.get_decoder("atspeed", lm, draft=draft, gamma=2, N=1, verification="relaxed")

    def counts(broken: bool) -> np.ndarray:
        dec.engine.verifier = RelaxedBeamVerifier(broken_residual=broken)
        recs = dec.recommend_batch([prompt] * n, trie, 1, seeds=range(n))  # one seed per request
        return np.bincount([names.index(r.items[0][0]) for r in recs], minlength=len(names))

    want = np.array([exact[k] for k in names])
    want = want / want.sum() * n
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny forwards: one thread is several times faster on a busy machine
    try:
        good, bad = counts(False), counts(True)
    finally:
        torch.set_num_threads(threads)
    assert chisquare(good, want).pvalue > 1e-3
    assert chisquare(bad, want).pvalue < 1e-3


def test_relaxed_with_draft_equal_to_target_accepts_every_step(tiny_lm):
    trie = ItemTrie({f"i{k}": [2 + k % 5, 3 + k % 7, 4 + k] for k in range(20)}, EOS)
    gamma = 2
    for seed in range(3):
        dec = laser.get_decoder("atspeed", tiny_lm, draft=tiny_lm, gamma=gamma, N=4, verification="relaxed", seed=seed)
        rec = dec.recommend([5, 6, 7], trie, 4)
        assert len({i for i, _ in rec.items}) == 4
        assert [s for _, s in rec.items] == sorted((s for _, s in rec.items), reverse=True)
        assert rec.stats.target_forwards == -(-rec.beam_steps // (gamma + 1))


def test_underflowed_candidates_still_give_K_distinct():
    g = torch.Generator().manual_seed(0)
    p = np.array([1.0, 0.0, 0.0, 0.0])  # scores far below the best underflow to 0
    assert sorted(sample_distinct(p, 3, g)) == [0, 1, 2]
    chosen, ok = relaxed_accept(p, np.array([0.0, 0.5, 0.5, 0.0]), [1], 3, g)
    assert not ok and len(set(chosen)) == 3 and 0 in chosen
