"""An entity's own earlier text drafted first (laser/earlier.py): greedy stays lossless, and drafts from a
close earlier text are counted as its own."""

from __future__ import annotations

import pytest

import laser
from laser.earlier import EarlierFirst, EarlierFirstDrafter
from pools import RetrievalPool
from tests.helpers import greedy_reference, random_prompts

MAX_NEW = 40


@pytest.fixture(scope="module")
def refresh_case(tiny_lm):
    """Prompts, their greedy answers, and an "earlier text" per prompt: its answer with every 7th token
    changed (a close earlier version), with the group pool holding other prompts' answers."""
    vocab = tiny_lm.model.config.vocab_size
    prompts = random_prompts(12, vocab, seed=21)
    refs = [greedy_reference(tiny_lm, p, MAX_NEW) for p in prompts]
    earlier = [[(t + 1) % vocab if i % 7 == 6 else t for i, t in enumerate(ref)] for ref in refs]
    pool = RetrievalPool.from_token_ids(refs[6:] + random_prompts(10, 96, seed=4, length=(20, 40)))
    return prompts, refs, [EarlierFirst(e, pool) for e in earlier]


def test_continuation_follows_the_earlier_text():
    d = EarlierFirstDrafter([5, 6, 7, 8, 5, 6, 9, 10], inner=None, n_max=3, max_nodes=8)
    assert d.propose_chain([1, 5, 6], 3) == [7, 8, 5]
    d.commit([7, 8, 5, 6])  # all three drafts accepted, then the target's own token
    assert d.own_accepted == 3
    assert d.propose_chain([1, 5, 6, 7, 8, 5, 6], 2) == [9, 10]  # read on from the cursor, not the first match
    d.commit([4, 4])  # the draft rejected at once
    assert d.own_accepted == 3
    assert EarlierFirstDrafter([1, 2], None, 3, 8).propose_chain([9, 9], 4) == []  # no match: nothing
    lone = EarlierFirstDrafter([1, 2, 3, 4, 5, 6], None, 3, 8)
    assert lone.propose_chain([9, 3], 4) == [] and lone.match_length([9, 3]) == 0  # one token matches too often
    assert lone.propose_chain([7, 2, 3], 2) == [4, 5]


def test_earlier_branch_first_then_the_pool():
    pool = RetrievalPool.from_token_ids([[1, 2, 3, 4], [1, 2, 30, 40]])
    tree = EarlierFirst([1, 2, 50, 60], pool).open([0], max_nodes=6, n_max=2).propose([0, 1, 2])
    paths = tree.paths()
    assert paths[:2] == [(50,), (50, 60)]  # the earlier text's branch first
    assert {(3,), (30,)} <= set(paths) and len(paths) <= 6


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_with_earlier_text_equals_generate(tiny_lm, refresh_case, batch):
    prompts, refs, sources = refresh_case
    dec = laser.get_decoder("laser", tiny_lm, verification="greedy", K=8)
    outs = []
    for i in range(0, len(prompts), batch):
        outs += dec.generate_batch(prompts[i : i + batch], MAX_NEW, sources[i : i + batch])
    for prompt, ref, out in zip(prompts, refs, outs):
        assert out.token_ids == ref, prompt
    own = sum(o.stats.own_accepted or 0 for o in outs)
    accepted = sum(sum(o.stats.accepted_per_step) for o in outs)
    drafted = sum(sum(o.stats.drafted_per_step) for o in outs)
    assert own > 0.5 * accepted > 0  # most accepted drafts came from the close earlier text
    assert accepted < drafted  # its changed tokens were drafted and rejected: verification was exercised
