"""Stop strings: the overlap rule of transformers' StopStringCriteria, and greedy LASER with stop strings
equal to ``generate(stop_strings=...)`` token for token; generation rules honoured by relaxed verification."""

from __future__ import annotations

import pytest
import torch

import laser
from laser.rules import GenerationRules, TokenText, stop_string_hit
from pools import RetrievalPool
from tests.helpers import random_prompts, save_tiny_model

MAX_NEW = 40


class FakeText:
    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def __call__(self, token: int) -> str:
        return self.pieces[token]


@pytest.mark.parametrize(
    "pieces, hit",
    [
        (["st", "op"], True),
        (["stop"], True),
        (["st", "opera"], True),
        (["sto", "pper"], True),
        (["las", "topper"], True),
        (["s", "to", "pped"], True),
        (["stop", "at"], False),
        (["st", "op", "at"], False),
        (["st", "opera", "tion"], False),
        (["x", "s", "t", "o"], False),
    ],
)
def test_stop_string_must_overlap_the_last_token(pieces, hit):
    assert stop_string_hit(list(range(len(pieces))), ["stop"], FakeText(pieces)) is hit


@pytest.fixture(scope="module")
def byte_lm(tmp_path_factory):
    return laser.load_model(str(save_tiny_model(tmp_path_factory.mktemp("stop") / "model")), dtype="float32")


def _ascii_pair(lm, ids: list[int]) -> str | None:
    """A two-token stop string from the middle of a greedy answer, both tokens printable ASCII."""
    text = TokenText(lm.tokenizer)
    for i in range(8, len(ids) - 1):
        a, b = text(ids[i]), text(ids[i + 1])
        if len(a) == len(b) == 1 and (a + b).isascii() and (a + b).isprintable() and (a + b).strip():
            return a + b
    return None


def _generate(lm, prompt: list[int], **kw) -> list[int]:
    out = lm.model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=MAX_NEW,
        do_sample=False,
        tokenizer=lm.tokenizer,
        **kw,
    )
    ids = out[0, len(prompt) :].tolist()
    return ids[: ids.index(1) + 1] if 1 in ids else ids  # up to EOS (id 1), as our decoders report


def test_greedy_laser_with_stop_strings_equals_generate(byte_lm):
    prompts = random_prompts(12, len(byte_lm.tokenizer), seed=7, length=(8, 20))
    plain = [_generate(byte_lm, p) for p in prompts]
    pools = [RetrievalPool.from_token_ids(plain[6:]), RetrievalPool.from_token_ids(plain[:6])]
    decoder = laser.get_decoder("laser", byte_lm, verification="greedy")
    checked = 0
    for i, (prompt, ref_plain) in enumerate(zip(prompts, plain)):
        stop = _ascii_pair(byte_lm, ref_plain)
        if stop is None:
            continue
        rules = GenerationRules(stop_strings=(stop, "\n\n"), no_repeat_ngram_size=3)
        ref = _generate(byte_lm, prompt, stop_strings=[stop, "\n\n"], no_repeat_ngram_size=3)
        out = decoder.generate(prompt, MAX_NEW, pool=pools[i // 6], rules=rules)
        assert out.token_ids == ref, f"prompt {i}: stop {stop!r}"
        if len(ref) < MAX_NEW and (not ref or ref[-1] != 1):
            assert out.stats.finish_reason == "stop"
            checked += 1
    assert checked >= 3  # the stop actually cut several answers


def test_stop_strings_need_a_tokenizer(tiny_lm):
    decoder = laser.get_decoder("autoregressive", tiny_lm)
    with pytest.raises(ValueError, match="stop_strings need the model's tokenizer"):
        decoder.generate([5, 6, 7], 4, rules=GenerationRules(stop_strings=("x",)))


@pytest.mark.parametrize("verification", ["relaxed", "greedy"])
def test_rules_apply_under_every_trie_verification(byte_lm, verification):
    prompts = random_prompts(6, len(byte_lm.tokenizer), seed=3, length=(8, 20))
    pool = RetrievalPool.from_token_ids([_generate(byte_lm, p) for p in prompts])
    decoder = laser.get_decoder("laser", byte_lm, verification=verification)
    outs = decoder.generate_batch(
        prompts, MAX_NEW, [pool] * 6, rules=GenerationRules(no_repeat_ngram_size=1, min_new_tokens=30)
    )
    for out in outs:
        body = [t for t in out.token_ids if t != 1]
        assert len(body) == len(set(body)), "a token repeated under no_repeat_ngram_size=1"
        assert len(out.token_ids) >= 30 or out.stats.finish_reason == "length"
