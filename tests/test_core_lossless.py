"""The key invariant: greedy verification reproduces the target's greedy decoding token for token."""
from __future__ import annotations

import pytest

import laser
from pools import RetrievalPool
from tests.conftest import greedy_reference, random_prompts

MAX_NEW = 48


@pytest.fixture(scope="module")
def tiny_case(tiny_lm):
    prompts = random_prompts(24, tiny_lm.model.config.vocab_size, seed=11)
    refs = [greedy_reference(tiny_lm, p, MAX_NEW) for p in prompts]
    # A pool of the model's own greedy continuations of *other* prompts, plus noise texts.
    pool = RetrievalPool.from_token_ids(refs[12:] + random_prompts(20, 96, seed=5, length=(30, 60)))
    return prompts[:12] + prompts[12:], refs, pool


@pytest.mark.parametrize("name, params", [("resd", {}), ("laser", {"verification": "greedy"}),
                                          ("laser", {"verification": "greedy", "K": 8, "n_max": 2})])
def test_greedy_decoders_equal_generate_on_tiny_llama(tiny_lm, tiny_case, name, params):
    prompts, refs, pool = tiny_case
    decoder = laser.get_decoder(name, tiny_lm, **params)
    accepted = 0
    for prompt, ref in zip(prompts, refs):
        out = decoder.generate(prompt, MAX_NEW, pool=pool)
        assert out.token_ids == ref, f"prompt {prompt}"
        accepted += sum(out.stats.accepted_per_step)
    assert accepted > 0, "the pool never produced an accepted draft: the test would not exercise verification"


def test_batched_greedy_equals_generate(tiny_lm, tiny_case):
    prompts, refs, pool = tiny_case
    outs = laser.get_decoder("laser", tiny_lm, verification="greedy").generate_batch(prompts, MAX_NEW, [pool] * len(prompts))
    assert [o.token_ids for o in outs] == refs


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


@pytest.mark.slow
def test_greedy_laser_equals_generate_on_bundled_model(smollm):
    topics = ["Toy Story", "The Matrix", "Titanic", "Jurassic Park", "Star Wars", "Casablanca"]
    prompts = [f"In two sentences, describe the movie {t} for a film recommender." for t in topics]
    decoder = laser.get_decoder("laser", smollm, verification="greedy")
    ids = [decoder.encode(p) for p in prompts]
    refs = [greedy_reference(smollm, i, 40) for i in ids]
    accepted = 0
    for i, (prompt_ids, ref) in enumerate(zip(ids, refs)):
        pool = RetrievalPool.from_token_ids(refs[:i] + refs[i + 1:])  # related text: the other answers
        out = decoder.generate(prompt_ids, 40, pool=pool)
        assert out.token_ids == ref, prompts[i]
        accepted += sum(out.stats.accepted_per_step)
    assert accepted > 0
