"""DSBD: the dynamic program, one layer's verification and the decoder against target beam sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

import laser
from laser.decoders.dsbd.algorithm import acceptance_distribution, acceptance_rates, draw, dynamic_width, verify_layer

P = np.array([0.4, 0.3, 0.2, 0.1])
Q = np.array([0.1, 0.2, 0.3, 0.4])


def seeded(n: int) -> list:
    """One sampling setting per request, seeds 0..n-1 (beam sampling draws at temperature 1)."""
    return [laser.SamplingParams(1.0, seed=s) for s in range(n)]


def random_pq(seed: int, n: int = 6):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
    return p, q


@pytest.mark.parametrize("seed", range(4))
def test_dp_rows_sum_to_one(seed):
    p, q = random_pq(seed)
    P_ = acceptance_distribution(acceptance_rates(p, q, 6))
    assert P_.sum(1) == pytest.approx(np.ones(7))
    assert np.all(P_ >= -1e-12) and np.allclose(np.triu(P_, 1), 0)


def test_dp_matches_a_simulation_of_the_accept_residual_loop():
    p, q = random_pq(7, n=5)
    m, n = 4, 20000
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(m + 1)
    for _ in range(n):  # no width cap: count acceptances among m i.i.d. drafts from q
        counts[verify_layer(p, q, draw(q, m, g), m + 1, g)[1]] += 1
    want = acceptance_distribution(acceptance_rates(p, q, m))[m] * n
    keep = want >= 5
    pooled = lambda c: np.append(c[keep], c[~keep].sum()) if (~keep).any() else c  # noqa: E731
    assert chisquare(pooled(counts), pooled(want)).pvalue > 1e-3


def test_width_rules():
    p, q = random_pq(3)
    assert dynamic_width(p, p, 6, 0.9, 1) == 6  # p = q: everything is accepted
    widths = [dynamic_width(p, q, 6, t, 2) for t in (0.1, 0.5, 0.7, 0.9, 0.99)]
    assert all(2 <= w <= 6 for w in widths) and widths == sorted(widths, reverse=True)


def layer_draws(width: int, n_drafts: int, n: int, broken: bool) -> np.ndarray:
    g = torch.Generator().manual_seed(1)
    out = np.zeros((width, 4))
    for _ in range(n):
        chosen, _ = verify_layer(P, Q, draw(Q, n_drafts, g), width, g, broken)
        for slot, x in enumerate(chosen):
            out[slot, x] += 1
    return out


def test_one_beam_one_draft_is_speculative_sampling():
    n = 6000
    assert chisquare(layer_draws(1, 1, n, False)[0], P * n).pvalue > 1e-3
    assert chisquare(layer_draws(1, 1, n, True)[0], P * n).pvalue < 1e-6


def test_every_output_beam_follows_p_beam():
    n = 6000
    good, bad = layer_draws(2, 3, n, False), layer_draws(2, 3, n, True)
    assert all(chisquare(row, P * n).pvalue > 1e-3 for row in good)
    assert any(chisquare(row, P * n).pvalue < 1e-6 for row in bad)


@pytest.mark.slow
def test_dsbd_on_a_toy_model_matches_target_beam_sampling():
    """Two-sample chi-square: the final beams of dsbd (fixed width) vs the target's own beam sampling."""
    lm = laser.tiny_llama(vocab_size=6, seed=3, logit_scale=1.0, eos_token_id=1)  # flat target
    draft = laser.tiny_llama(vocab_size=6, seed=9, logit_scale=8.0, eos_token_id=1)  # peaked, unlike it
    prompt, n, length = [2, 3, 4], 800, 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny forwards: one thread is several times faster on a busy machine

    def outcomes(name: str, broken: bool = False, **params) -> list[tuple]:
        dec = laser.get_decoder(name, lm, W=2, **params)
        if broken:
            dec.engine.verifier.broken_residual = True
        gens = dec.generate_batch([prompt] * n, length, sampling=seeded(n))
        return [tuple(g.token_ids) for g in gens]

    target = outcomes("beam_sample")
    good = outcomes("dsbd", draft=draft, gamma=2, W_S=3, dynamic=False)
    bad = outcomes("dsbd", True, draft=draft, gamma=2, W_S=3, dynamic=False)

    def pvalue(a, b):
        cats = sorted(set(a) | set(b))
        table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
        big = table.sum(0) >= 10
        table = np.column_stack([table[:, big], table[:, ~big].sum(1)])
        return chi2_contingency(table).pvalue

    torch.set_num_threads(threads)
    assert pvalue(target, good) > 1e-3
    assert pvalue(target, bad) < 1e-3


def test_dsbd_counts_and_widths(tiny_lm):
    dec = laser.get_decoder("dsbd", tiny_lm, draft=tiny_lm, gamma=3, W=2, W_S=4, t=0.7)
    gen = dec.generate([5, 6, 7], 12)
    st_layers = gen.stats.target_forwards
    assert 1 <= st_layers <= 12 and len(gen.token_ids) <= 12
    with pytest.raises(ValueError, match="t must lie in"):
        laser.get_decoder("dsbd", tiny_lm, draft="truncate:1", t=0.0)


# ---- the memory-saving one-cache variant ------------------------------------------------------------


def run_states(dec, prompts, length: int, seeds) -> list:
    """Decode and return each request's BeamSampleState (the engine keeps them in ``request.state``)."""
    reqs = [dec.request(p, length, sampling=laser.SamplingParams(1.0, seed=s)) for p, s in zip(prompts, seeds)]
    dec.engine.run(reqs)
    return reqs


def test_lowest_perplexity_is_the_highest_mean_log_prob():
    from laser.decoders.dsbd.algorithm import Beams

    beams = Beams([(1, 2), (3,), (4, 5, 6)], [2, 1, 1], [-1.0, -0.8, -1.2])  # means -0.5, -0.8, -0.4
    assert beams.lowest_perplexity() == Beams([(4, 5, 6)], [1], [-1.2])


@pytest.fixture(scope="module")
def one_cache_runs():
    torch.set_num_threads(1)
    lm = laser.tiny_llama(seed=3, eos_token_id=1)
    prompts, seeds = [[5, 6, 7], [9, 10, 11, 12]], [3, 4]
    one = laser.get_decoder("dsbd", lm, draft=lm, gamma=3, W=3, W_S=3, dynamic=False, one_cache=True)
    plain = laser.get_decoder("beam_sample", lm, W=3)
    return lm, run_states(one, prompts, 16, seeds), run_states(plain, prompts, 16, seeds)


def test_one_cache_keeps_one_beam_and_accepts_every_layer_when_draft_is_target(one_cache_runs):
    lm, one, _ = one_cache_runs
    for r in one:
        st = r.state
        assert st.inputs[0] == 1 and set(st.inputs) == {1}  # one input beam, one tree, every iteration
        assert st.forest_nodes[-1] <= st.depth + 3 * 3 + 1  # the beam's path + one tree of drafts
        # draft = target and W = W_S: every drafted layer is accepted, plus the bonus layer
        full = [n for n in st.layers_per_forward[:-1]]
        assert full and all(n == 4 for n in full) and 1 <= st.layers_per_forward[-1] <= 4


def test_one_cache_output_is_a_continuation_with_its_target_score(one_cache_runs):
    lm, one, _ = one_cache_runs
    for r in one:
        seq, score = r.state.best()
        assert r.new_tokens == list(seq) and 1 <= len(seq) <= 16
        assert all(t not in lm.eos_ids for t in seq[:-1])  # nothing continues past an end token
        with torch.no_grad():
            logits = lm.model(torch.tensor([r.tokens])).logits[0, r.prompt_len - 1 : -1]
        want = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(seq)[:, None]).sum()
        assert score == pytest.approx(float(want), abs=1e-3)


def test_one_cache_needs_no_more_target_forwards_than_beam_sampling(one_cache_runs):
    _, one, plain = one_cache_runs
    for a, b in zip(one, plain):
        assert a.stats.target_forwards <= b.stats.target_forwards
    assert sum(a.stats.target_forwards for a in one) < sum(b.stats.target_forwards for b in plain)


# ---- rules broken on purpose: each test above and below must notice ---------------------------------


def test_the_dp_simulation_notices_a_broken_residual():
    p, q = random_pq(7, n=5)
    m, n = 4, 6000
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(m + 1)
    for _ in range(n):
        counts[verify_layer(p, q, draw(q, m, g), m + 1, g, broken_residual=True)[1]] += 1
    want = acceptance_distribution(acceptance_rates(p, q, m))[m] * n
    assert chisquare(counts, want).pvalue < 1e-6


def exact_sequence_probs(lm, prompt: list[int], length: int, ends: set[int]) -> dict[tuple, float]:
    """Ancestral sampling's exact law over sequences of up to ``length`` tokens (stopping at an end token)."""
    out, frontier = {}, {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, pr in frontier.items():
            with torch.no_grad():
                logits = lm.model(torch.tensor([prompt + list(seq)])).logits[0, -1]
            for v, pv in enumerate(torch.softmax(logits.double(), -1).tolist()):
                (out if v in ends else nxt)[seq + (v,)] = pr * pv
        frontier = nxt
    return {**out, **frontier}


@pytest.mark.slow
def test_one_beam_one_draft_decoder_is_exact_ancestral_sampling():
    """W = W_S = 1: DSBD is speculative sampling, so its sequences follow the target's own law exactly."""
    lm = laser.tiny_llama(vocab_size=5, seed=3, logit_scale=1.0, eos_token_id=1)
    draft = laser.tiny_llama(vocab_size=5, seed=9, logit_scale=6.0, eos_token_id=1)
    prompt, n, length = [2, 3, 4], 1000, 3
    law = exact_sequence_probs(lm, prompt, length, lm.eos_ids)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def pvalue(broken: bool) -> float:
        dec = laser.get_decoder("dsbd", lm, draft=draft, gamma=2, W=1, W_S=1, dynamic=False)
        dec.engine.verifier.broken_residual = broken
        got = [tuple(g.token_ids) for g in dec.generate_batch([prompt] * n, length, sampling=seeded(n))]
        cats = sorted(law)
        obs, exp = np.array([got.count(c) for c in cats]), np.array([law[c] * n for c in cats])
        assert obs.sum() == n  # every output is a sequence of the law's support
        big = exp >= 5
        if not big.all():  # pool the rare sequences into one cell
            obs, exp = np.append(obs[big], obs[~big].sum()), np.append(exp[big], exp[~big].sum())
        return chisquare(obs, exp).pvalue

    good, bad = pvalue(False), pvalue(True)
    torch.set_num_threads(threads)
    print(f"p-values: exact {good:.3g}, broken residual {bad:.3g}")
    assert good > 1e-3 and bad < 1e-3


def test_layers_per_forward_and_dynamic_widths_stay_in_range(tiny_lm):
    dec = laser.get_decoder("dsbd", tiny_lm, draft="truncate:1", gamma=3, W=2, W_S=4, W_min=2, t=0.7)
    for r in run_states(dec, [[5, 6, 7], [8, 9]], 14, [0, 1]):
        st = r.state
        assert all(1 <= n <= 3 + 1 for n in st.layers_per_forward)
        assert len(st.layers_per_forward) == r.stats.target_forwards
        assert all(2 <= w <= 4 for w in st.widths)  # W_min <= W_L <= W_S (the bonus layer: W)
