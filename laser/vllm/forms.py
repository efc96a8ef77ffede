"""Each decoder's and each generation rule's vLLM form, in one place.

A request names a decoder with its settings (:meth:`laser.decoders.base.Decoder.settings`) and carries
:class:`laser.GenerationRules` keywords. On this package's engine both apply as they are; on vLLM with
LASER as its drafter they become keywords of :meth:`laser.vllm.VllmEngine.submit` and fields of vLLM's
``SamplingParams``:

========================  ==========================================  ===================================
what                      this package's engine (``hf``)              vLLM
========================  ==========================================  ===================================
``repetition_penalty``    applied to every tree row in verification   ``repetition_penalty``
``min_new_tokens``        EOS banned until reached                    ``min_tokens``
``stop_strings``          checked on accepted tokens; text keeps it   ``stop``; text keeps it
``bad_words_ids``         last token banned after the others          ``bad_words`` (their text)
``no_repeat_ngram_size``  banned n-gram completions                   none (refused; docs/engines.md)
decoder ``verification``  its verifier (greedy, relaxed top-k and p)  greedy: vLLM's; relaxed: LASER's
decoder ``K``             draft budget in tree nodes, or ``auto``     chain length, at most ``MAX_DRAFT``
pool ``none`` or no pool  no drafts                                   ``draft=False``
========================  ==========================================  ===================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from laser.defaults import N_MAX, RELAXED_K, RELAXED_P
from laser.vllm.request_args import DraftLen

if TYPE_CHECKING:
    from laser.decoders.base import Decoder

MAX_DRAFT = 8  # the longest draft chain of a job's vLLM engine (vLLM's num_speculative_tokens)
# vLLM 0.32 refuses custom logits processors while speculative decoding is on, and no built-in
# SamplingParams field bans n-gram repeats
NO_VLLM_FORM = ("no_repeat_ngram_size",)


def decoder_options(cls: type[Decoder], settings: dict[str, Any], pooled: bool) -> dict[str, Any]:
    """:meth:`~laser.vllm.VllmEngine.submit` keywords of one request decoded by decoder class ``cls`` with
    ``settings``; ``pooled``: the request has a pool to draft from."""
    if "vllm" not in cls.engines:
        raise ValueError(f"decoder {cls.name!r} has no vLLM form (it runs on {list(cls.engines)})")
    return {
        "verification": settings.get("verification", "greedy"),
        "k": int(settings.get("k", RELAXED_K)),
        "p": float(settings.get("p", RELAXED_P)),
        "draft": pooled and cls.pool != "none" and settings.get("K", 0) != 0,
        "n_max": int(settings.get("n_max", N_MAX)),
        "min_prob": float(settings.get("min_prob", 0.0)),
    }


def draft_length(settings: dict[str, Any]) -> DraftLen:
    """The engine's draft length for a decoder's ``K``: ``"auto"`` (follows the load) or a fixed chain."""
    K = settings.get("K", 0)
    return "auto" if K == "auto" else min(int(K), MAX_DRAFT)


def with_vllm_form(rules: dict[str, Any] | None) -> dict[str, Any]:
    """``rules`` without those that have no vLLM form (for a retry, whose stronger rules are best effort)."""
    return {k: v for k, v in (rules or {}).items() if k not in NO_VLLM_FORM}


def rule_params(rules: dict[str, Any] | None, tokenizer: Any = None) -> dict[str, Any]:
    """:class:`laser.GenerationRules` keywords as vLLM ``SamplingParams`` keywords (the table above); a
    rule with no vLLM form is refused with its name."""
    rules = {k: v for k, v in (rules or {}).items() if v}
    out: dict[str, Any] = {}
    penalty = rules.pop("repetition_penalty", 1.0)
    if penalty != 1.0:
        out["repetition_penalty"] = float(penalty)
    if "min_new_tokens" in rules:
        out["min_tokens"] = int(rules.pop("min_new_tokens"))
    if "stop_strings" in rules:
        out["stop"] = list(rules.pop("stop_strings"))
        out["include_stop_str_in_output"] = True  # as on this package's engine: the text keeps it
    if "bad_words_ids" in rules:
        if tokenizer is None:
            raise ValueError("bad_words_ids on vLLM needs the engine's tokenizer")
        # vLLM bans each word with and without a leading space itself (the spaced form only where it is as
        # many tokens as the word: a few spaced forms this package's engine bans pass on vLLM)
        out["bad_words"] = sorted({tokenizer.decode(list(w)).strip() for w in rules.pop("bad_words_ids")})
    if rules:
        raise ValueError(f"generation rule(s) {sorted(rules)} have no vLLM form; use execution.engine: hf")
    return out
