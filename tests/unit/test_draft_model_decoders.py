"""Draft-model decoders: batched drafting equals per-request drafting, ``spec_sampling`` and ``topk_imp``
are greedy-lossless at temperature 0 (batch 1 and 8, partial acceptance), spec_sampling and lossless
topk_imp sample exactly from the target (chi-square; the broken residual is caught), and their inputs
are checked by name.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import laser
from laser.decoders.draft_model.decoders import SpecSampling, TopKImp
from laser.decoders.draft_model.drafter import ModelDrafter
from laser.models import LoadedModel
from laser.sampling import SamplingParams
from laser.verify import RejectionSampler
from tests.helpers import greedy_reference, random_prompts
from test_core_sampling import SAMPLES, VOCAB, _exact_joint, toy  # noqa: F401  (toy is a fixture)

MAX_NEW = 32


def _perturbed(lm: LoadedModel, scale: float, seed: int) -> LoadedModel:
    """The target with a noisy output head: a draft that agrees with it often but not always."""
    draft = copy.deepcopy(lm.model)
    torch.manual_seed(seed)
    with torch.no_grad():
        draft.lm_head.weight.add_(scale * draft.lm_head.weight.std() * torch.randn_like(draft.lm_head.weight))
    return LoadedModel(draft, None, f"perturbed-{seed}")


@pytest.fixture(scope="module")
def noisy(tiny_lm):
    return _perturbed(tiny_lm, 0.6, 1)


@pytest.fixture(scope="module")
def case(tiny_lm):
    prompts = random_prompts(8, tiny_lm.model.config.vocab_size, seed=21)
    return prompts, [greedy_reference(tiny_lm, p, MAX_NEW) for p in prompts]


# ---- batched drafting ---------------------------------------------------------------------------------


def test_batched_proposals_equal_one_by_one(tiny_lm, noisy):
    """Uneven contexts, a budget of 0 and a smaller budget: the same chains, distributions and caches."""
    prompts = random_prompts(5, 96, seed=4, length=(3, 17))
    budgets = [None, 0, 2, None, 1]
    alone = [ModelDrafter(noisy.model, p, 3) for p in prompts]
    together = [ModelDrafter(noisy.model, p, 3) for p in prompts]
    for step in range(3):
        trees_alone = [d.propose(p, b) for d, p, b in zip(alone, prompts, budgets)]
        trees = ModelDrafter.propose_batch(together, prompts, budgets)
        for a, t, d_a, d_t in zip(trees_alone, trees, alone, together):
            assert t.tokens.tolist() == a.tokens.tolist()
            if len(a) > 1:
                assert torch.allclose(t.draft_dists, a.draft_dists, atol=1e-5)
            assert d_t.cache.get_seq_length() == d_a.cache.get_seq_length()
            for la, lt in zip(d_a.cache.layers, d_t.cache.layers):
                assert torch.allclose(la.keys, lt.keys, atol=1e-5) and torch.allclose(la.values, lt.values, atol=1e-5)
        # the target accepts the first draft (when any) and appends token 5; both sides commit the same
        for i, (d_a, d_t, tree) in enumerate(zip(alone, together, trees)):
            new = tree.tokens[1:2].tolist() + [5]
            d_a.commit(new)
            d_t.commit(new)
            prompts[i] = prompts[i] + new


def test_one_draft_forward_per_position_for_the_whole_batch(tiny_lm, noisy):
    calls = []
    handle = noisy.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        prompts = random_prompts(8, 96, seed=6)
        drafters = [ModelDrafter(noisy.model, p, 3) for p in prompts]
        trees = ModelDrafter.propose_batch(drafters, prompts, [None] * 8)
    finally:
        handle.remove()
    assert len(calls) == 3 and all(len(t) == 4 for t in trees)


# ---- spec_sampling ------------------------------------------------------------------------------------


def _check_greedy(lm, prompts, refs, outs):
    for prompt, ref, out in zip(prompts, refs, outs):
        assert out.token_ids == ref, laser.testing.first_divergence(lm, prompt, out.token_ids, ref)
    accepted = sum(sum(o.stats.accepted_per_step) for o in outs)
    drafted = sum(sum(o.stats.drafted_per_step) for o in outs)
    assert 0 < accepted < drafted, "acceptance must be partial for the test to exercise verification"


@pytest.mark.parametrize(
    "name, params", [("spec_sampling", {}), ("topk_imp", {"mode": "paper"}), ("topk_imp", {"mode": "lossless", "K": 3})]
)
def test_greedy_equals_generate_at_batch_1_and_8(tiny_lm, noisy, case, name, params):
    prompts, refs = case
    dec = laser.get_decoder(name, tiny_lm, draft=noisy, gamma=3, **params)
    _check_greedy(tiny_lm, prompts, refs, [dec.generate(p, MAX_NEW) for p in prompts])
    _check_greedy(tiny_lm, prompts, refs, dec.generate_batch(prompts, MAX_NEW))


def test_truncated_draft_by_name_and_registry(tiny_lm, case):
    prompts, refs = case
    dec = laser.get_decoder("spec_sampling", tiny_lm, draft="truncate:1")
    assert dec.params() == {"draft": "truncate:1", "gamma": 4} and SpecSampling.greedy_params() == {}
    assert [o.token_ids for o in dec.generate_batch(prompts[:4], 16)] == [r[:16] for r in refs[:4]]
    assert laser.get_decoder("topk_imp", tiny_lm).params()["draft"] == "truncate:1"  # a quarter, at least 1
    for cls in (SpecSampling, TopKImp):
        assert cls.pool == "none" and cls.requires == ("draft_model",)


def test_bad_inputs_are_named(tiny_lm):
    with pytest.raises(ValueError, match="draft model path not found: './no/such/draft'"):
        laser.get_decoder("spec_sampling", tiny_lm, draft="./no/such/draft")
    other = laser.tiny_llama(vocab_size=64, seed=1)
    with pytest.raises(ValueError, match="target 'tiny-llama-3' has 96 logits, draft 'tiny-llama-1' has 64"):
        laser.get_decoder("spec_sampling", tiny_lm, draft=other)
    for bad in ("truncate:x", "truncate:9"):
        with pytest.raises(ValueError, match="truncate|layers"):
            laser.get_decoder("spec_sampling", tiny_lm, draft=bad)
    with pytest.raises(ValueError, match="gamma"):
        laser.get_decoder("spec_sampling", tiny_lm, draft="truncate:1", gamma=0)
    with pytest.raises(ValueError, match="K"):
        laser.get_decoder("topk_imp", tiny_lm, draft="truncate:1", K=0)
    with pytest.raises(ValueError, match="mode"):
        laser.get_decoder("topk_imp", tiny_lm, draft="truncate:1", mode="fast")
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


# ---- exact sampling on a toy model, through the decoders ------------------------------------------


class _BrokenSpecSampling(SpecSampling):
    def verifier(self):
        return RejectionSampler(broken_residual=True)


def _joint_counts(dec, prompt: list[int]) -> np.ndarray:
    outs = dec.generate_batch([prompt] * SAMPLES, 2, sampling=[SamplingParams(1.0, seed=s) for s in range(SAMPLES)])
    counts = np.zeros(VOCAB * VOCAB)
    for o in outs:
        counts[o.token_ids[0] * VOCAB + o.token_ids[1]] += 1
    return counts


def _pvalue(lm, counts: np.ndarray, prompt: list[int]) -> float:
    exact = _exact_joint(lm, prompt, SamplingParams(temperature=1.0)).astype(np.float64)
    exact = exact / exact.sum() * SAMPLES
    keep = exact >= 5  # expected counts of 5 or more; the rest pooled into one cell
    if keep.all():
        return chisquare(counts, exact).pvalue
    return chisquare(np.append(counts[keep], counts[~keep].sum()), np.append(exact[keep], exact[~keep].sum())).pvalue


def test_spec_sampling_samples_the_target(toy):  # noqa: F811
    lm, draft = toy
    prompt, draft_lm = [2, 3, 4], LoadedModel(draft, None, "toy-draft")
    good = _pvalue(lm, _joint_counts(SpecSampling(lm, draft=draft_lm, gamma=2), prompt), prompt)
    bad = _pvalue(lm, _joint_counts(_BrokenSpecSampling(lm, draft=draft_lm, gamma=2), prompt), prompt)
    assert good > 1e-3, f"correct rule rejected: p={good:.2g}"
    assert bad < 1e-3, f"broken residual not caught: p={bad:.2g}"


def test_topk_imp_lossless_samples_the_target_and_paper_mode_does_not(toy):  # noqa: F811
    lm, draft = toy
    prompt, draft_lm = [2, 3, 4], LoadedModel(draft, None, "toy-draft")
    lossless = _pvalue(lm, _joint_counts(TopKImp(lm, draft=draft_lm, gamma=2, K=3, mode="lossless"), prompt), prompt)
    paper = _pvalue(lm, _joint_counts(TopKImp(lm, draft=draft_lm, gamma=2, K=3, mode="paper"), prompt), prompt)
    assert lossless > 1e-3, f"lossless TopK-ImpSpecDec rejected: p={lossless:.2g}"
    assert paper < 1e-3, f"paper mode is not lossless, yet matched the target: p={paper:.2g}"


@pytest.mark.slow
def test_spec_sampling_on_the_bundled_model(smollm):
    """A bundled draft by name (vocabulary checked through both tokenizers), and a truncated draft at batch 3."""
    assert laser.get_decoder("spec_sampling", smollm, draft="smollm2-135m").params()["draft"] == "smollm2-135m"
    dec = laser.get_decoder("spec_sampling", smollm, draft="truncate:8", gamma=4)
    ids = [dec.encode(f"In one sentence, describe the movie {t}.") for t in ("Alien", "Heat", "Titanic")]
    refs = [greedy_reference(smollm, i, 24) for i in ids]
    _check_greedy(smollm, ids, refs, dec.generate_batch(ids, 24))
