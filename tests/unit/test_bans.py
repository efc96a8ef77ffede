"""Bad words from an index (laser/bans.py, laser/vllm/bad_words.py): the same bans as checking every word,
and on vLLM's metadata exactly what vLLM's own loop bans, at rows, bonus rows and draft positions."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from laser.bans import BanIndex, mask_banned
from laser.vllm.bad_words import IndexedBadWords, ban_drafts, ban_rows, take_words

V = 12


def _words(rng: random.Random, n: int) -> list[list[int]]:
    return [[rng.randrange(V) for _ in range(rng.randint(1, 3))] for _ in range(n)]


def _by_loop(words: list[list[int]], text: list[int]) -> set[int]:
    """Every word checked in turn, as generate and vLLM do."""
    out = set()
    for w in words:
        if len(w) - 1 <= len(text) and (len(w) == 1 or text[len(text) - len(w) + 1 :] == w[:-1]):
            out.add(w[-1])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_index_bans_what_the_loop_bans(seed):
    rng = random.Random(seed)
    words = _words(rng, rng.randint(0, 30))
    index = BanIndex(words)
    for _ in range(20):
        text = [rng.randrange(V) for _ in range(rng.randint(0, 6))]
        assert set(index.banned(text)) == _by_loop(words, text), (words, text)
    assert bool(index) == bool(words)


def test_mask_banned_sets_minus_infinity_in_one_write():
    logits = torch.zeros(3, V)
    mask_banned(logits, [(0, {1, 2}), (2, [5, V + 3, -1])])  # out-of-vocabulary ids are ignored
    assert torch.isinf(logits).nonzero().tolist() == [[0, 1], [0, 2], [2, 5]]


@dataclass
class _Meta:
    """The fields of vLLM's SamplingMetadata the bad words read."""

    bad_words_token_ids: dict[int, list[list[int]]]
    output_token_ids: list[list[int]]
    spec_token_ids: list[list[int]] | None


def _metadata(rng: random.Random, rows: int, spec_rows: bool):
    words = {r: _words(rng, rng.randint(1, 25)) for r in range(rows) if rng.random() < 0.7}
    outputs = [[rng.randrange(V) for _ in range(rng.randint(0, 5))] for _ in range(rows)]
    spec = [[rng.randrange(V) for _ in range(rng.randint(0, 3))] for _ in range(rows)] if spec_rows else None
    return _Meta(words, outputs, spec), words, outputs, spec


@pytest.mark.parametrize("seed", range(8))
def test_rows_and_bonus_rows_match_vllms_own_bad_words(seed):
    ops = pytest.importorskip("vllm.v1.sample.ops.bad_words")
    rng = random.Random(seed)
    meta, words, outputs, spec = _metadata(rng, 5, spec_rows=True)
    for bonus in (False, True):
        want = torch.randn(5, V, generator=torch.Generator().manual_seed(seed))
        got = want.clone()
        past = [o + s for o, s in zip(outputs, spec)] if bonus else outputs  # vLLM's bonus context
        ops.apply_bad_words(want, words, past)
        _, indexes = take_words(meta)  # type: ignore[arg-type]
        ban_rows(got, indexes, outputs, spec, bonus)
        assert torch.equal(got, want)


@pytest.mark.parametrize("seed", range(8))
def test_draft_positions_match_vllms_own_bad_words(seed):
    ops = pytest.importorskip("vllm.v1.sample.ops.bad_words")
    rng = random.Random(seed)
    meta, words, outputs, spec = _metadata(rng, 6, spec_rows=True)
    counts = [len(s) for s in spec]
    past = []  # vLLM's per-position contexts: the output, then each draft prefix
    for out, s in zip(outputs, spec):
        past += [out + s[:j] for j in range(len(s))]
    want = torch.randn(sum(counts), V, generator=torch.Generator().manual_seed(seed))
    got = want.clone()
    ops.apply_bad_words_with_drafts(want, words, past, counts)
    _, indexes = take_words(meta)  # type: ignore[arg-type]
    ban_drafts(got, indexes, outputs, spec, counts)
    assert torch.equal(got, want)
    assert torch.isinf(want).any()


class _Recorder:
    """Stands in for vLLM's Sampler: records the bad words its processors were handed."""

    def apply_logits_processors(self, logits, sampling_metadata, predict_bonus_token):
        self.seen = sampling_metadata.bad_words_token_ids
        return logits


def test_the_sampler_mixin_takes_the_words_from_vllms_loop_and_bans_them_itself():
    sampler = type("Sampler", (IndexedBadWords, _Recorder), {})()
    meta = _Meta({0: [[3], [1, 4]]}, [[1]], None)
    out = sampler.apply_logits_processors(torch.zeros(1, V), meta, False)
    assert sampler.seen == {}  # vLLM's own loop gets none
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [3, 4]
