"""vLLM's ``bad_words`` applied from an index (:mod:`laser.bans`) instead of a Python loop over the words.

vLLM bans a request's bad words by checking every word at every row and draft position, each hit one small
tensor write: with a few hundred words a request (every form of every genre an entity's input lacks) that
loop is most of a step on a CPU. The plug-in takes the words out of the sampling metadata before vLLM's
processors run and applies them itself, with vLLM's meaning (a word's prefix is matched against the
request's output tokens, drafts included at a draft position), one look-up per prefix length and one
tensor write a step:

- :class:`IndexedBadWords` mixes into the runner's ``Sampler`` (steps without drafts and the bonus token
  after a draft chain);
- :func:`ban_drafts` is called by the relaxed rejection sampler (:mod:`laser.vllm.relaxed`) for the draft
  positions, before the relaxed rule judges them, so a draft token that would name a bad word is rejected
  by the same mask.

Greedy outputs are those of vLLM's own bad words (tested against plain vLLM).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from laser.bans import BanIndex, ban_index, mask_banned
from laser.vllm.sources import Bounded

if TYPE_CHECKING:
    import torch
    from vllm.v1.sample.metadata import SamplingMetadata


def take_words(sampling_metadata: SamplingMetadata) -> tuple[SamplingMetadata, dict[int, BanIndex]]:
    """The metadata without its bad words (vLLM's processors then skip them) and each row's index; a vLLM
    whose metadata lacks what the index needs keeps its own loop."""
    words = getattr(sampling_metadata, "bad_words_token_ids", None)
    if not words or not all(hasattr(sampling_metadata, f) for f in ("output_token_ids", "spec_token_ids")):
        return sampling_metadata, {}
    indexes = {row: _index_of(ws) for row, ws in words.items()}
    return dataclasses.replace(sampling_metadata, bad_words_token_ids={}), indexes


_BY_LIST: Bounded[int, tuple[object, BanIndex]] = Bounded(4096)  # a request's word list -> its index


def _index_of(words: list[list[int]]) -> BanIndex:
    """The index of a request's word list, built at its first step: vLLM hands the same list object every
    step of the request, so later steps cost one look-up (the list is kept, so its id is not reused)."""
    hit = _BY_LIST.get(id(words))
    if hit is None or hit[0] is not words:
        hit = (words, ban_index(tuple(tuple(w) for w in words)))
        _BY_LIST[id(words)] = hit
    return hit[1]


def ban_rows(
    logits: torch.Tensor,
    indexes: dict[int, BanIndex],
    outputs: Sequence[Sequence[int]],
    spec: Sequence[Sequence[int]] | None,
    bonus: bool,
) -> None:
    """One logits row per request: each request's banned next tokens after its output (and, for the bonus
    token, after its whole draft chain)."""
    mask_banned(
        logits,
        (
            (row, index.banned(list(outputs[row]) + (list(spec[row]) if bonus and spec else [])))
            for row, index in indexes.items()
        ),
    )


def ban_drafts(
    logits: torch.Tensor,
    indexes: dict[int, BanIndex],
    outputs: Sequence[Sequence[int]],
    spec: Sequence[Sequence[int]] | None,
    num_draft_tokens: Sequence[int],
) -> None:
    """One logits row per draft position: at a request's j-th draft, the tokens banned after its output
    followed by its first j drafts."""
    hits: list[tuple[int, Any]] = []
    start = 0
    for row, n in enumerate(num_draft_tokens):
        index = indexes.get(row)
        if index is not None and n:
            text = list(outputs[row])
            drafts = list(spec[row]) if spec else []
            for j in range(n):
                hits.append((start + j, index.banned(text + drafts[:j])))
        start += n
    mask_banned(logits, hits)


class IndexedBadWords:
    """Mixin over vLLM's ``Sampler``: bad words from the index, not vLLM's loop (module docstring)."""

    def apply_logits_processors(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, predict_bonus_token: bool
    ) -> torch.Tensor:
        meta, indexes = take_words(sampling_metadata)
        logits = super().apply_logits_processors(logits, meta, predict_bonus_token)  # type: ignore[misc]
        if indexes:
            ban_rows(logits, indexes, meta.output_token_ids, meta.spec_token_ids, predict_bonus_token)
        return logits


def index_bad_words(sampler: Any) -> Any:
    """``sampler`` (the runner's vLLM ``Sampler``) with :class:`IndexedBadWords` mixed into its class."""
    if not isinstance(sampler, IndexedBadWords):
        sampler.__class__ = type(f"Indexed{type(sampler).__name__}", (IndexedBadWords, type(sampler)), {})
    return sampler
