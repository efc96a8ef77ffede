"""The key invariant: greedy verification reproduces the target's greedy decoding token for token, for
every greedy-capable drafter (trie pools, a draft model's chains), at batch 1 and batch 8.

Pools never hold a prompt's own answer: each half of the prompts drafts from the other half's greedy
texts (plus noise), so acceptance is partial and a wrong verification rule shows. A failure message
names the first diverging token and the target's fp32 argmax margin there (a near-tie or a real bug).
"""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch

import laser
from laser.decoders.draft_model.drafter import ModelDrafter, truncated_copy
from laser.engine import Request, TreeDecodingEngine
from laser.testing import first_divergence
from laser.verify import RejectionSampler
from pools import RetrievalPool
from tests.helpers import greedy_reference, random_prompts

MAX_NEW = 48


@pytest.fixture(scope="module")
def tiny_case(tiny_lm):
    prompts = random_prompts(24, tiny_lm.model.config.vocab_size, seed=11)
    refs = [greedy_reference(tiny_lm, p, MAX_NEW) for p in prompts]
    noise = random_prompts(20, 96, seed=5, length=(30, 60))
    # prompts 0-11 draft from the answers of 12-23 and the other way round: never their own answer
    pools = [RetrievalPool.from_token_ids(refs[12:] + noise), RetrievalPool.from_token_ids(refs[:12] + noise)]
    return prompts, refs, [pools[i // 12] for i in range(24)]


@pytest.fixture(scope="module")
def noisy_draft(tiny_lm):
    """A draft model that agrees with the target often but not always: the target with a perturbed head."""
    draft = copy.deepcopy(tiny_lm.model)
    torch.manual_seed(1)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.6 * draft.lm_head.weight.std() * torch.randn_like(draft.lm_head.weight))
    return draft


def _check(lm, prompts, refs, outs, drafted_somewhere=True):
    for prompt, ref, out in zip(prompts, refs, outs):
        assert out.token_ids == ref, f"prompt {prompt}: {first_divergence(lm, prompt, out.token_ids, ref)}"
    accepted = sum(sum(o.stats.accepted_per_step) for o in outs)
    drafted = sum(sum(o.stats.drafted_per_step) for o in outs)
    assert accepted > 0, "no draft was ever accepted: the test would not exercise verification"
    assert accepted < drafted, "every draft was accepted: the pools or drafts must differ from the answers"


@pytest.mark.parametrize(
    "name, params",
    [("resd", {}), ("laser", {"verification": "greedy"}), ("laser", {"verification": "greedy", "K": 8, "n_max": 2})],
)
def test_trie_decoders_equal_generate_at_batch_1(tiny_lm, tiny_case, name, params):
    prompts, refs, pools = tiny_case
    decoder = laser.get_decoder(name, tiny_lm, **params)
    _check(tiny_lm, prompts, refs, [decoder.generate(p, MAX_NEW, pool=pool) for p, pool in zip(prompts, pools)])


@pytest.mark.parametrize("batch", [8, 24])
def test_trie_decoders_equal_generate_in_batches(tiny_lm, tiny_case, batch):
    prompts, refs, pools = tiny_case
    decoder = laser.get_decoder("laser", tiny_lm, verification="greedy")
    outs = []
    for i in range(0, len(prompts), batch):
        outs += decoder.generate_batch(prompts[i : i + batch], MAX_NEW, pools[i : i + batch])
    _check(tiny_lm, prompts, refs, outs)


def test_exact_rows_beside_relaxed_rows_equal_generate(tiny_lm, tiny_case):
    """A relaxed LASER engine decodes greedy requests (``exact``, e.g. retries) beside its relaxed ones: the
    exact rows equal generate, the relaxed rows equal the relaxed decoder alone, which differs from generate."""
    prompts, refs, pools = tiny_case
    relaxed = laser.get_decoder("laser", tiny_lm, verification="relaxed", k=3, p=0.01, K=8)  # drafts batch-blind
    reqs = [relaxed.request(p, MAX_NEW, pool, exact=i % 2 == 0) for i, (p, pool) in enumerate(zip(prompts, pools))]
    done = {id(r): r for r in relaxed.engine.run(reqs)}
    outs = [laser.Generation(done[id(r)].new_tokens, "", done[id(r)].stats) for r in reqs]
    _check(tiny_lm, prompts[::2], refs[::2], outs[::2])
    alone = [relaxed.generate(p, MAX_NEW, pool=pool) for p, pool in zip(prompts[1::2], pools[1::2])]
    assert [o.token_ids for o in outs[1::2]] == [a.token_ids for a in alone]
    assert any(a.token_ids != ref for a, ref in zip(alone, refs[1::2])), "relaxed never left greedy: test is blind"


def _run_engine(
    lm, prompts: list[list[int]], drafter: Callable[[list[int]], laser.Drafter], max_new: int, batch: int
) -> list[Request]:
    engine = TreeDecodingEngine(lm.model, RejectionSampler(), lm.eos_ids)
    out: list[Request] = []
    for i in range(0, len(prompts), batch):
        reqs = [
            Request(tokens=list(p), prompt_len=len(p), drafter=drafter(p), max_new_tokens=max_new)
            for p in prompts[i : i + batch]
        ]
        out += engine.run(reqs)
    return out


@pytest.mark.parametrize("batch, gamma", [(1, 3), (8, 3), (8, 1)])
def test_draft_model_chains_equal_generate(tiny_lm, tiny_case, noisy_draft, batch, gamma):
    prompts, refs, _ = tiny_case
    reqs = _run_engine(tiny_lm, prompts, lambda p: ModelDrafter(noisy_draft, p, gamma), MAX_NEW, batch)
    outs = [laser.Generation(r.new_tokens, "", r.stats) for r in reqs]
    _check(tiny_lm, prompts, refs, outs)


def test_autoregressive_equals_generate(tiny_lm, tiny_case):
    prompts, refs, _ = tiny_case
    decoder = laser.get_decoder("autoregressive", tiny_lm)
    for prompt, ref in zip(prompts[:6], refs[:6]):
        out = decoder.generate(prompt, MAX_NEW)
        assert out.token_ids == ref
        assert out.stats.target_forwards == len(ref) and out.stats.aal == 1.0


def test_stops_at_eos_and_reports_reason(tiny_lm):
    prompt = random_prompts(1, 96, seed=2)[0]
    ref = greedy_reference(tiny_lm, prompt, 200)
    out = laser.get_decoder("autoregressive", tiny_lm).generate(prompt, 200)
    assert out.token_ids == ref
    eos = tiny_lm.model.generation_config.eos_token_id
    assert out.stats.finish_reason == ("eos" if ref[-1] == eos else "length")
    short = laser.get_decoder("autoregressive", tiny_lm).generate(prompt, 3)
    assert short.token_ids == ref[:3] and short.stats.new_tokens == 3


TOPICS = ["Toy Story", "The Matrix", "Titanic", "Jurassic Park", "Star Wars", "Casablanca", "Alien", "Heat"]


@pytest.fixture(scope="module")
def bundled_case(smollm):
    prompts = [f"In two sentences, describe the movie {t} for a film recommender." for t in TOPICS]
    decoder = laser.get_decoder("laser", smollm, verification="greedy")
    ids = [decoder.encode(p) for p in prompts]
    refs = [greedy_reference(smollm, i, 40) for i in ids]
    return decoder, ids, refs


@pytest.mark.slow
def test_greedy_laser_equals_generate_on_bundled_model(smollm, bundled_case):
    decoder, ids, refs = bundled_case
    pools = [RetrievalPool.from_token_ids(refs[:i] + refs[i + 1 :]) for i in range(len(ids))]  # other answers
    _check(smollm, ids, refs, [decoder.generate(p, 40, pool=pool) for p, pool in zip(ids, pools)])
    _check(smollm, ids, refs, decoder.generate_batch(ids, 40, pools))  # batch 8


@pytest.mark.slow
def test_draft_model_chains_equal_generate_on_bundled_model(smollm, bundled_case):
    _, ids, refs = bundled_case
    draft = truncated_copy(smollm.model, 6)
    for batch in (1, 8):
        reqs = _run_engine(smollm, ids, lambda p: ModelDrafter(draft, p, 4), 40, batch)
        _check(smollm, ids, refs, [laser.Generation(r.new_tokens, "", r.stats) for r in reqs])


RULES = [
    laser.GenerationRules(repetition_penalty=1.3),
    laser.GenerationRules(no_repeat_ngram_size=3),
    laser.GenerationRules(no_repeat_ngram_size=1),
    laser.GenerationRules(min_new_tokens=40),
    laser.GenerationRules(bad_words_ids=((7,), (12, 30))),
    laser.GenerationRules(repetition_penalty=0.8, no_repeat_ngram_size=2, min_new_tokens=10),
]


def _generate_kwargs(rules: laser.GenerationRules) -> dict:
    kw = {
        "repetition_penalty": rules.repetition_penalty,
        "no_repeat_ngram_size": rules.no_repeat_ngram_size,
        "min_new_tokens": rules.min_new_tokens,
    }
    if rules.bad_words_ids:
        kw["bad_words_ids"] = [list(w) for w in rules.bad_words_ids]
    return kw


@pytest.mark.parametrize(
    "rules", RULES, ids=lambda r: ",".join(f"{k}={v}" for k, v in vars(r).items() if v not in (1.0, 0, ()))
)
def test_generation_rules_inside_verification_equal_generate(tiny_lm, tiny_case, rules):
    prompts, _, pools = tiny_case
    refs = []
    for p in prompts:
        out = tiny_lm.model.generate(
            torch.tensor([p]),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            **_generate_kwargs(rules),
        )
        refs.append(out[0, len(p) :].tolist())
    decoder = laser.get_decoder("laser", tiny_lm, verification="greedy")
    outs = decoder.generate_batch(prompts[:8], MAX_NEW, pools[:8], rules=rules)  # batch 8
    outs += [decoder.generate(p, MAX_NEW, pool=pool, rules=rules) for p, pool in zip(prompts[8:], pools[8:])]
    for prompt, ref, out in zip(prompts, refs, outs):
        assert out.token_ids == ref, f"prompt {prompt}: rules {rules}"
    assert sum(sum(o.stats.accepted_per_step) for o in outs) > 0


@pytest.mark.parametrize("slots", [8, 32])
def test_continuous_batching_equals_generate_with_arrivals_mid_decode(tiny_lm, slots):
    """48 requests of different lengths stream through ``slots`` rows, arriving a few per step while
    others are mid-decode; rows are refilled and compacted as requests finish. With the adaptive budget
    (tree sizes change from step to step), every output equals target greedy."""
    prompts = random_prompts(48, tiny_lm.model.config.vocab_size, seed=23)
    max_new = [8 + (7 * i) % 41 for i in range(48)]
    refs = [greedy_reference(tiny_lm, p, n) for p, n in zip(prompts, max_new)]
    pool = RetrievalPool.from_token_ids(refs[::2] + random_prompts(20, 96, seed=5, length=(30, 60)))
    decoder = laser.get_decoder("laser", tiny_lm, verification="greedy")
    waiting = [decoder.request(p, n, pool) for p, n in zip(prompts, max_new)]
    queue, done, steps_with_arrivals = list(waiting), [], 0

    def arrive(free: int) -> list[Request]:
        nonlocal steps_with_arrivals
        n = min(free, 3, len(queue))  # a few at a time: the others arrive while these decode
        steps_with_arrivals += n > 0 and len(done) > 0
        return [queue.pop(0) for _ in range(n)]

    for req in decoder.engine.stream(arrive, slots):
        done.append(req)
    assert len(done) == 48 and steps_with_arrivals > 0
    outs = [laser.Generation(r.new_tokens, "", r.stats) for r in waiting]
    _check(tiny_lm, prompts, refs, outs)
    assert len(set(decoder.engine.budget.chosen)) > 1, "the budget never changed: the test would not vary trees"
