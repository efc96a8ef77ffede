"""The generation rules' vLLM forms (laser/vllm/forms.py) as vLLM takes them: a first text's whole genre
ban is more bad words than vLLM accepts by default, and the engines' environment makes room. Skipped
without vLLM."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")


def _word_tokenizer(words):
    """A tokenizer with one token per word and per spaced word (``comedy``, `` comedy``), as large
    vocabularies have: vLLM then bans both forms of each bad word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    pieces = sorted({p for w in words for s in (w, " " + w) for p, _ in pre.pre_tokenize_str(s)})
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(["<unk>", *pieces])}, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre, decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    hf.max_token_id = len(pieces)  # what vLLM's tokenizer wrapper adds
    return hf


def test_a_whole_genre_ban_fits_in_vllms_bad_words(monkeypatch):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from laser.vllm.env import BAD_WORDS_LIMITS, vllm_env
    from laser.vllm.forms import rule_params
    from pipelines.knowledge.retry import banned_words
    from pipelines.quality import genre_forms, unsupported_genres

    genres = unsupported_genres("item", item={"genres": ["Drama"]})
    tok = _word_tokenizer([c for g in genres for f in genre_forms(g) for c in (f, f.capitalize())])
    words = rule_params({"bad_words_ids": banned_words(tok, genres)}, tok)["bad_words"]
    for key in BAD_WORDS_LIMITS:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(VLLMValidationError, match="Too many bad words"):  # vLLM's default limit: 128
        SamplingParams(bad_words=words).update_from_tokenizer(tok)
    for key, value in vllm_env(threads=1).items():
        if key in BAD_WORDS_LIMITS:
            monkeypatch.setenv(key, value)
    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tok)
    assert len(params.bad_words_token_ids) > 128
