"""Sampling: settings, hand-computed rejection cases, and chi-square tests that the output distribution
equals the target's, on toy distributions and on a toy model.

How we know the statistical tests can fail: each runs twice, once with the correct rule and once with
``RejectionSampler(broken_residual=True)`` (after a rejection it resamples from p instead of the
residual max(0, p - q)), and asserts that the broken run is rejected at p < 1e-3.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import laser
from laser.decoders.draft_model.drafter import ModelDrafter
from laser.engine import Request, TreeDecodingEngine
from laser.sampling import SamplingParams, target_probs
from laser.tree import DraftTree
from laser.verify import RejectionSampler, expand_beams


def test_sampling_settings_are_checked():
    for bad in ({"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_target_probs_follow_generate_warpers():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert target_probs(logits, SamplingParams()).tolist() == [1.0, 0.0, 0.0, 0.0]  # greedy: one-hot
    p = target_probs(logits, SamplingParams(temperature=2.0, top_k=2))
    want = torch.softmax(torch.tensor([1.0, 0.5]), 0)
    assert torch.allclose(p[:2], want) and p[2:].sum() == 0
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))  # 0.64 + 0.24 >= 0.7: two kept
    assert (p > 0).tolist() == [True, True, False, False]


def _probs(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_rejection_hand_computed_cases():
    gen = torch.Generator().manual_seed(0)
    sampler = RejectionSampler()
    # p(x) = 1 at the root row: the one-hot draft is always accepted, then the bonus from p at row 1
    tree = DraftTree.chain(0, [2])
    out = sampler.verify_tree(tree, _probs([0, 0, 1.0], [0, 1.0, 0]), gen)
    assert out.path == [0, 1] and out.tokens == [2, 1]
    # p(x) = 0: always rejected; the residual puts all mass on the other token
    out = sampler.verify_tree(tree, _probs([0.0, 1.0, 0.0], [1 / 3] * 3), gen)
    assert out.path == [0] and out.tokens == [1]
    # two one-hot children, the first impossible, the second certain: the walk moves to the second
    tree = DraftTree([0, 1, 2], [-1, 0, 0])
    out = sampler.verify_tree(tree, _probs([0.0, 0.0, 1.0], [1.0, 0, 0], [0, 0, 1.0]), gen)
    assert out.path == [0, 2] and out.tokens == [2, 2]
    # a draft distribution q with q(x) <= p(x) is always accepted (min(1, p/q) = 1)
    tree = DraftTree.chain(0, [1], draft_dists=_probs([0.5, 0.25, 0.25]))
    accepted = sum(
        sampler.verify_tree(tree, _probs([0.2, 0.5, 0.3], [1.0, 0, 0]), gen).path == [0, 1] for _ in range(50)
    )
    assert accepted == 50


P_ROOT = [0.5, 0.3, 0.15, 0.05]
P_CHILD = [0.1, 0.2, 0.3, 0.4]


Q_ROOT = [0.1, 0.1, 0.1, 0.7]


def _first_token_counts(make_tree, probs: torch.Tensor, n: int, broken: bool) -> np.ndarray:
    sampler, gen = RejectionSampler(broken_residual=broken), torch.Generator().manual_seed(7)
    counts = np.zeros(probs.shape[1])
    for _ in range(n):
        counts[sampler.verify_tree(make_tree(gen), probs, gen).tokens[0]] += 1
    return counts


def _sampled_chain(gen):  # the draft token is drawn from q, as speculative sampling requires
    q = torch.tensor([Q_ROOT])
    return DraftTree.chain(0, [int(torch.multinomial(q[0], 1, generator=gen))], draft_dists=q)


@pytest.mark.parametrize(
    "make_tree",
    [
        _sampled_chain,  # chain, sampled draft with its distribution
        lambda gen: DraftTree([0, 3, 2], [-1, 0, 0]),  # two one-hot drafts at the root (trie drafts)
    ],
    ids=["chain-with-q", "tree-one-hot"],
)
def test_rejection_first_token_matches_target(make_tree):
    n_nodes = len(make_tree(torch.Generator()))
    probs = torch.stack([torch.tensor(P_ROOT)] + [torch.tensor(P_CHILD)] * (n_nodes - 1))
    n = 6000
    good = chisquare(_first_token_counts(make_tree, probs, n, broken=False), np.array(P_ROOT) * n).pvalue
    bad = chisquare(_first_token_counts(make_tree, probs, n, broken=True), np.array(P_ROOT) * n).pvalue
    assert good > 1e-3, f"correct residual rejected: p={good:.2g}"
    assert bad < 1e-3, f"broken residual not caught: p={bad:.2g}"


# ---- a toy model end to end: two sampled tokens, joint distribution vs the model's own --------------

VOCAB, SAMPLES = 6, 1200


@pytest.fixture(scope="module")
def toy():
    lm = laser.tiny_llama(vocab_size=VOCAB, hidden_size=32, seed=5, logit_scale=1.0, eos_token_id=1)
    lm.model.generation_config.eos_token_id = None  # never stop early: exactly two tokens per sample
    draft = copy.deepcopy(lm.model)
    torch.manual_seed(2)
    with torch.no_grad():
        draft.lm_head.weight.add_(2.0 * torch.randn_like(draft.lm_head.weight))
    return lm, draft


def _exact_joint(lm, prompt: list[int], sampling: SamplingParams) -> np.ndarray:
    with torch.no_grad():
        p1 = target_probs(lm.model(torch.tensor([prompt])).logits[0, -1], sampling)
        rows = lm.model(torch.tensor([prompt + [t] for t in range(VOCAB)])).logits[:, -1]
        p2 = target_probs(rows, sampling)
    return (p1[:, None] * p2).numpy().ravel()


def _sampled_joint(lm, draft, prompt, sampling, broken: bool) -> np.ndarray:
    engine = TreeDecodingEngine(lm.model, RejectionSampler(broken_residual=broken), set())
    reqs = [
        Request(
            tokens=list(prompt),
            prompt_len=len(prompt),
            max_new_tokens=2,
            sampling=SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, seed=s),
            drafter=ModelDrafter(draft, prompt, gamma=2, sampling=SamplingParams(sampling.temperature, seed=s)),
        )
        for s in range(SAMPLES)
    ]
    engine.run(reqs)
    counts = np.zeros(VOCAB * VOCAB)
    for r in reqs:
        a, b = r.new_tokens
        counts[a * VOCAB + b] += 1
    return counts


def test_speculative_sampling_on_a_toy_model_matches_the_target(toy):
    lm, draft = toy
    prompt, sampling = [2, 3, 4], SamplingParams(temperature=1.0)
    exact = _exact_joint(lm, prompt, sampling)
    exact = exact.astype(np.float64) / exact.astype(np.float64).sum() * SAMPLES
    keep = exact >= 5  # chi-square needs expected counts of 5 or more; the rest is pooled into one cell

    def pooled(c):  # noqa: E306
        return np.append(c[keep], c[~keep].sum()) if (~keep).any() else c

    good = chisquare(pooled(_sampled_joint(lm, draft, prompt, sampling, False)), pooled(exact)).pvalue
    bad = chisquare(pooled(_sampled_joint(lm, draft, prompt, sampling, True)), pooled(exact)).pvalue
    assert good > 1e-3, f"correct rule rejected: p={good:.2g}"
    assert bad < 1e-3, f"broken residual not caught: p={bad:.2g}"


def test_a_seed_reproduces_its_text(toy):
    lm, _ = toy
    dec = laser.get_decoder("laser", lm, verification="greedy")
    runs = [dec.generate([2, 3, 4], 12, sampling=SamplingParams(temperature=1.0, seed=s)).token_ids for s in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_relaxed_verification_refuses_sampling(tiny_lm):
    with pytest.raises(ValueError, match="relaxed verification is deterministic"):
        laser.get_decoder("laser", tiny_lm).generate([3, 4], 4, sampling=SamplingParams(temperature=0.7))


def test_expand_beams_hand_computed():
    # root -> a(node 1). Scores: root 0, a -0.5. log p rows: root [-0.1, -2.3, ...], a [-1.2, -0.4, ...]
    tree = DraftTree([0, 1], [-1, 0], scores=np.array([0.0, -0.5]))
    lp = torch.log(torch.tensor([[0.9, 0.1, 0.0], [0.3, 0.7, 0.0]]).clamp(min=1e-9))
    best = expand_beams(tree, lp, [0, 1], width=3)
    assert [(n, t) for n, t, _ in best] == [(0, 0), (1, 1), (1, 0)]
    assert [round(s, 4) for *_, s in best] == [
        round(float(x), 4) for x in (np.log(0.9), -0.5 + np.log(0.7), -0.5 + np.log(0.3))
    ]


def test_chain_tree_carries_draft_probabilities():
    q = _probs([0.2, 0.8, 0.0], [0.5, 0.0, 0.5])
    tree = DraftTree.chain(7, [1, 2], draft_dists=q)
    assert tree.is_chain and tree.draft_probs.tolist() == pytest.approx([1.0, 0.8, 0.5])
    assert torch.equal(tree.draft_dists[:2], q) and tree.children() == [[1], [2], []]
    with pytest.raises(ValueError, match="draft distributions"):
        DraftTree.chain(7, [1], draft_dists=q)


def test_all_pairs_seen_by_the_toy_sampler(toy):
    """Guards the chi-square test's power: the toy distribution spreads over many token pairs."""
    lm, _ = toy
    exact = _exact_joint(lm, [2, 3, 4], SamplingParams(temperature=1.0))
    assert (exact > 0.01).sum() >= 12 and list(itertools.islice(exact, 1))
