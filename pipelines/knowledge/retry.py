"""The degenerate-text policies (``retry`` for flawed knowledge rows), and the generation rules of a decode task.

A row that is degenerate, cut at the token limit or a fragment, or that names a genre its input does not
have (pipelines/quality/), is regenerated once: greedily (the task's decoder with its
``greedy_params()``, same pool; the autoregressive decoder when it has none) under the task's
``retry_rules`` (a stronger repetition penalty and a no-repeat n-gram size), with the unsupported genres'
words banned (``bad_words_ids``). The retry replaces the row unless it reads worse (flawed or
degenerate where the first was not, or less grounded); a kept retry has its own quality flags and ``greedy_retry`` set, so a
still-flawed row stays visible.

Under ``generation.ban_unsupported_genres`` (the task's ``ban_unsupported_genres``) the ban comes first: a
first text cannot name a genre its entity's input lacks, nor an item a year but its own (:func:`first_rules`),
and its retry bans the same. The engines apply bad words from an index (:mod:`laser.bans`): a few look-ups
and one tensor write a step, whatever the number of words.

Under every policy that acts on a degenerate row (``retry``, ``retry_greedy``, ``fail``) a first text stops
as soon as it is surely degenerate (:class:`LoopStop`): whatever it went on to say within its token limit
would be retried or failed the same, so the tokens after that point are work thrown away.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from laser.rules import NO_RULES, GenerationRules
from pipelines.knowledge.records import DecodeTask, Params
from pipelines.store.knowledge import KnowledgeRow
from pipelines.quality import (
    entity_quality,
    genre_forms,
    surely_degenerate,
    text_quality,
    unsupported_genres,
)
from pipelines.workers import GenerationRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

GREEDY_RETRY_DECODER = "autoregressive"  # what a retry that asks for the greedy text decodes with


def task_rules(rules: Params | None) -> GenerationRules:
    """A task's rules (keywords of :class:`laser.GenerationRules`) as the decoder takes them."""
    return GenerationRules(**rules) if rules else NO_RULES  # type: ignore[arg-type]  # checked by its __init__


def flawed(row: KnowledgeRow) -> bool:
    """Degenerate, cut or a fragment."""
    return bool(row.degenerate or row.cut or row.fragment)


def ungrounded(row: KnowledgeRow) -> bool:
    """The row names a fact its input does not support."""
    return row.grounding is not None and row.grounding < 1.0


def retry_reasons(first: KnowledgeRow) -> list[str]:
    """Why a first text was decoded again (each flaw it has; ``stopped at a loop`` when :class:`LoopStop`
    ended it)."""
    flags = [k for k, v in (("degenerate", first.degenerate), ("cut", first.cut), ("fragment", first.fragment)) if v]
    return flags + ["ungrounded"] * ungrounded(first) + ["stopped at a loop"] * (first.finish_reason == LOOP)


def worse(retry: KnowledgeRow, first: KnowledgeRow) -> bool:
    """The retry reads worse than the first text: flawed where it was not, degenerate where it was not, or
    otherwise as flawed and less grounded."""

    def score(row: KnowledgeRow) -> tuple[bool, bool, float]:
        return flawed(row), bool(row.degenerate), -(row.grounding if row.grounding is not None else 1.0)

    return score(retry) > score(first)


def banned_words(tokenizer: PreTrainedTokenizerBase | None, genres: list[str]) -> tuple[tuple[int, ...], ...]:
    """Token sequences of every way the text could name ``genres`` (lower/capitalised, with/without a space)."""
    if tokenizer is None:
        return ()
    surfaces = {v for g in genres for f in genre_forms(g) for c in (f, f.capitalize()) for v in (c, " " + c)}
    return tuple(sorted({tuple(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in surfaces} - {()}))


CENTURIES = ("18", "19", "20")  # the years item grounding counts: 1800-2099 (pipelines/quality/)


def year_words(tokenizer: PreTrainedTokenizerBase, year: int) -> tuple[tuple[int, ...], ...]:
    """Digit sequences that, banned, leave ``year`` the only year of 1800-2099 a text can write: every
    ``18d``, ``19d`` and ``20d`` but ``year``'s own first three digits, and after those every fourth digit but
    its own (38 words, where a ban of every year would take 600: vLLM takes at most 512 bad words). Needs a
    tokenizer that writes each digit as one token; () for one that merges digits."""
    digit = [tokenizer(str(d), add_special_tokens=False)["input_ids"] for d in range(10)]
    if any(len(ids) != 1 for ids in digit):
        return ()
    ids = [ids[0] for ids in digit]
    if tokenizer("1995", add_special_tokens=False)["input_ids"] != [ids[1], ids[9], ids[9], ids[5]]:
        return ()
    own = str(year)
    words = []
    for century in CENTURIES:
        for third in "0123456789":
            if own[:3] == century + third:
                words += [century + third + fourth for fourth in "0123456789" if fourth != own[3]]
            else:
                words.append(century + third)
    return tuple(tuple(ids[int(c)] for c in w) for w in words)


class GenreBan:
    """A worker's bans of unsupported facts: ``ban(rules, genres, year)`` is ``rules`` with every form of
    ``genres`` banned (``bad_words_ids``, :func:`banned_words`) and, for an item of year ``year``, every other
    year (:func:`year_words`); each genre and year tokenised once per worker."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._words: dict[str, tuple[tuple[int, ...], ...]] = {}
        self._years: dict[int, tuple[tuple[int, ...], ...]] = {}

    def _forms(self, word: str) -> tuple[tuple[int, ...], ...]:
        if word not in self._words:
            self._words[word] = banned_words(self.tokenizer, [word])
        return self._words[word]

    def __call__(self, rules: Params | None, genres: Sequence[str], year: int | None = None) -> Params | None:
        if year is not None and year not in self._years:
            self._years[year] = year_words(self.tokenizer, year)
        years = self._years[year] if year is not None else ()
        if not genres and not years:
            return rules
        words = {w for g in genres for w in self._forms(g)} | set(years)
        return {**(rules or {}), "bad_words_ids": tuple(sorted(words))}


def item_year(req: GenerationRequest) -> int | None:
    """An item's year, which its text may name (no other): None for users and items without one."""
    year = (req.item or {}).get("year") if req.entity_type == "item" else None
    try:
        return int(year) if isinstance(year, (int, float, str)) else None
    except (TypeError, ValueError):
        return None


def first_rules(task: DecodeTask, req: GenerationRequest, ban: GenreBan) -> Params | None:
    """The rules of a first text: the task's, and under ``ban_unsupported_genres`` every genre the entity's
    input does not have banned, and every year but an item's own (so a first text cannot name one, which
    its grounding would count against it)."""
    if not task.ban_unsupported_genres:
        return task.rules
    return ban(task.rules, unsupported_genres(req.entity_type, req.history, req.item), item_year(req))


def retry_decoder(decoder: str, params: Params) -> tuple[str, Params]:
    """(decoder, params) of the greedy retry: ``decoder`` under its greedy parameters, else autoregressive."""
    import laser

    cls = laser.available_decoders().get(decoder)
    greedy = cls.greedy_params() if cls is not None else None
    if greedy is None:
        return GREEDY_RETRY_DECODER, {}
    return decoder, {**params, **greedy}


LOOP = "loop"  # the finish reason of a first text stopped because it is surely degenerate
LOOP_POLICIES = ("retry", "retry_greedy", "fail")  # the policies that act on a degenerate row


class LoopStop:
    """An engine's per-request stop check (:data:`laser.request.Halt`) for a first text under a policy that
    acts on degenerate rows: at every ``every``-th new token, ``(LOOP, that many tokens)`` once the text up
    to there is surely degenerate (:func:`pipelines.quality.surely_degenerate`, each token left adding at
    most ``per_token`` words), else None. The stop falls at the same token however many tokens the
    engine's steps add, so it depends on the text alone, not on the engine or its drafts.

    Args:
        decode: token ids -> text, as the row's text is decoded.
        max_new_tokens: the request's token limit.
        per_token: the most words one token adds (:func:`pipelines.quality.words_per_token`).
    """

    every = 8

    def __init__(self, decode: Callable[[list[int]], str], max_new_tokens: int, per_token: int) -> None:
        self.decode, self.max_new_tokens, self.per_token = decode, max_new_tokens, per_token
        self.checked = 0

    def __call__(self, new_tokens: Sequence[int]) -> tuple[str, int] | None:
        for n in range(self.checked + self.every, len(new_tokens) + 1, self.every):
            self.checked = n
            if surely_degenerate(self.decode(list(new_tokens[:n])), max(self.max_new_tokens - n, 0) * self.per_token):
                return LOOP, n
        return None


class DegenerateTextError(ValueError):
    """A generated text is degenerate and the policy sends it to failures."""


@dataclass(frozen=True)
class RetryPlan:
    """How a flawed row is decoded again: ``decoder`` with ``params`` under ``rules``, from the same pool
    when ``keep_pool``; ``compare``: the retry replaces the first row only when it does not read worse."""

    decoder: str
    params: Params
    rules: Params | None
    keep_pool: bool
    compare: bool


def retry_plan(task: DecodeTask, req: GenerationRequest, row: KnowledgeRow, ban: GenreBan) -> RetryPlan | None:
    """What ``task.degenerate`` does with ``row``: nothing (None), a retry, or (``fail``) raise
    :class:`DegenerateTextError` for a degenerate row.

    - ``retry``: a flawed or ungrounded row is decoded again greedily (module docstring), kept unless worse;
    - ``retry_greedy``: a degenerate row is decoded again by the autoregressive decoder, without a pool,
      under the task's rules, and kept (flagged, when still degenerate);
    - ``keep``: the row stays, flagged.
    """
    if task.degenerate == "retry":
        if not (flawed(row) or ungrounded(row)):
            return None
        if task.ban_unsupported_genres:  # the first text's ban again (it named none of them)
            genres = unsupported_genres(req.entity_type, req.history, req.item)
        else:
            text = entity_quality(row.knowledge, row.finish_reason, req.entity_type, req.history, req.item)
            genres = text.grounding.unsupported_genres if text.grounding is not None else []
        name, params = retry_decoder(task.decoder, task.decoder_params)
        rules = ban(dict(task.retry_rules or task.rules or {}), genres, item_year(req))
        log.info(
            "%s %s: retrying with %s (degenerate %s, cut %s, fragment %s, unsupported genres %s)",
            req.entity_type,
            req.entity_id,
            name,
            row.degenerate,
            row.cut,
            row.fragment,
            genres,
        )
        return RetryPlan(name, params, rules, keep_pool=name == task.decoder, compare=True)
    if not row.degenerate or task.degenerate == "keep":
        return None
    reason = text_quality(row.knowledge, row.finish_reason).reason()
    if task.degenerate == "fail":
        raise DegenerateTextError(reason)
    log.info("%s %s: %s; regenerating with %s", req.entity_type, req.entity_id, reason, GREEDY_RETRY_DECODER)
    return RetryPlan(GREEDY_RETRY_DECODER, {}, task.rules, keep_pool=False, compare=False)
