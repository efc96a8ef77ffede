"""Knowledge prompts (user preference profiles, item descriptions) as Jinja2 templates.

A template is one file with two blocks, ``user`` and ``item``; each renders the text of ONE user chat message
(the engines apply the model's chat template, with :attr:`PromptTemplate.system` as its system message when
set). Shipped templates live in ``templates/`` (``movie``, ``book``, ``ecommerce``, ``news``); a team's own is
any file with both blocks (``prompts.template``). Templates render in Jinja2's sandbox with
``StrictUndefined`` (a misspelt name fails, never renders empty), ``trim_blocks`` and ``lstrip_blocks``.

What a block sees: ``item``: every column of the item's row by name (``title``, ``year``, ``genres``,
``category``, ``sub_category`` always; the dataset's further columns too), the row as ``item`` (``item.get("brand")``
reads a column that may be absent) and ``max_words``. ``user``: ``history`` (entries oldest first, each with
``title``, ``year``, ``genres``, ``rating``), ``user_id``, the user's attribute columns when given (and
``user``) and ``max_words``. Filter ``num`` writes a number as ``{:g}`` (``4.0`` -> ``4``).

Version: a shipped template's header line ``{#- version: kar-v5 -#}`` names its version (bumped by hand with
any wording change; tests pin the sources); a team's template, or any template with a system prompt, is
versioned by the hash of its source and system text. The version is written next to every knowledge row and
enters the run's config hash, so a changed template regenerates the knowledge it shapes.

History truncation rule (``user_prompt`` with a tokenizer and ``max_prompt_tokens``): entries are kept
oldest to newest; while the rendered prompt is longer than ``max_prompt_tokens`` tokens, the OLDEST
entry is dropped, so the kept entries are always the newest suffix of the history. The length counted is
the full chat-templated prompt (system text, role markers, generation prompt) when the tokenizer has a
chat template, otherwise the message text alone (``tokenizer.encode(text)``). If not even the newest
entry fits, a ``PromptTooLongError`` names the user.

Entity fields (titles, genres, categories) reach the model as text, never as control tokens: a
tokenizer turns the exact text of its special tokens (``<|im_end|>``, ``</s>``, ``[INST]``) into their
ids wherever it appears, so :func:`as_text` breaks any such marker in a field with a space after its
opening bracket (``< |im_end|>``) before the field enters a prompt. Where the model's tokenizer is known
(:func:`entity_prompt`), the message is also cleared of every text that tokenizer reads as one control
token, whatever its shape (:func:`without_control`: its special and added special tokens).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from pipelines.prompts.template import ITEM_FIELDS, PromptTemplate, shipped_template
from pipelines.workers import GenerationRequest, HistoryEntry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pipelines.knowledge.records import DecodeTask

ItemRow = Mapping[str, Any]  # a row of the items table as polars names it: item_id, title, year, genres, ...

PROMPT_VERSION = "kar-v5"  # the shipped movie and book templates' version (their header line)
MAX_WORDS = 120
TOKENS_PER_WORD = 1.6  # measured 1.56 on SmolLM2 profile-like prose with quoted titles (101 words, 158 tokens)
HEADROOM = 0.6  # ask for this share of what the budget holds: small models overshoot a requested length
HISTORY_GENRES = 2  # genres shown per history entry
DOMAINS = ("movie", "book")  # the domains dataset.domain names (and the recommendation prompts know)


class PromptTooLongError(ValueError):
    """Raised when a prompt cannot fit ``max_prompt_tokens`` even with one history entry."""


_TITLE_YEAR = re.compile(r"^(.*) \((\d{4})\)$")
# the opening bracket of what tokenizers spell control tokens in: <|...|> (ChatML, Llama 3) and its
# fullwidth <｜...｜> (DeepSeek), <name> and </name> (<s>, <unk>, <start_of_turn>, <filename>), <<SYS>> and
# <</SYS>> (Llama 2), [INST] / [/INST] and other [UPPER_CASE] markers (Mistral)
_CONTROL_OPENING = re.compile(
    r"<(?=[|\uff5c])|<(?=/?[A-Za-z_][\w.-]*>)|<(?=</?[A-Z][A-Z_]*>>)|\[(?=/?[A-Z][A-Z_]{2,}\])"
)


def as_text(value: object) -> str:
    """``value`` as prompt text that no tokenizer reads as a control token (module docstring)."""
    return _CONTROL_OPENING.sub(lambda m: m.group(0) + " ", str(value))


_CONTROL_TEXTS: weakref.WeakKeyDictionary[Any, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def _control_pattern(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str] | None:
    """A pattern of the texts ``tokenizer`` turns into one control token wherever they appear (None: none)."""
    if tokenizer not in _CONTROL_TEXTS:
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
        texts |= {t.content for t in added.values() if getattr(t, "special", False)}
        texts = {t for t in texts if len(t) > 1 and not t.isspace()}  # one character cannot be broken
        longest_first = sorted(texts, key=len, reverse=True)
        _CONTROL_TEXTS[tokenizer] = re.compile("|".join(map(re.escape, longest_first))) if texts else None
    return _CONTROL_TEXTS[tokenizer]


def without_control(text: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """``text`` with each of ``tokenizer``'s control-token texts broken by a space after its first character."""
    pattern = _control_pattern(tokenizer)
    for _ in range(8):  # a break could join two halves into a new marker: repeat until none is left
        if pattern is None or not pattern.search(text):
            return text
        text = pattern.sub(lambda m: m.group(0)[0] + " " + m.group(0)[1:], text)
    raise ValueError(f"cannot clear the control tokens of {type(tokenizer).__name__} from a prompt")


def _safe(value: Any) -> Any:
    """A field as a template sees it: text through :func:`as_text`, lists and tuples element-wise."""
    if isinstance(value, str):
        return as_text(value)
    if isinstance(value, (list, tuple)):
        return [_safe(v) for v in value]
    return value


def check_domain(domain: str) -> None:
    """A prompt domain this module writes prompts for (``movie``, ...), else ValueError naming the known ones."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown prompt domain {domain!r}; expected one of {sorted(DOMAINS)}")


def display_title(title: str, year: int | None = None) -> str:
    """``Title (1995)`` when the year is known, else the title."""
    return f"{title} ({year})" if year is not None else title


def format_rating(rating: float) -> str:
    """``4 stars``, ``4.5 stars``, ``1 star``."""
    value = f"{rating:g}"
    return f"{value} star" if value == "1" else f"{value} stars"


def words_for_budget(max_new_tokens: int) -> int:
    """The word count a prompt may ask for within ``max_new_tokens``: ``MAX_WORDS``, or fewer so that
    words x ``TOKENS_PER_WORD`` fit ``HEADROOM`` of the budget (rounded down to tens, at least 10)."""
    fit = int(max_new_tokens * HEADROOM / TOKENS_PER_WORD) // 10 * 10
    return max(10, min(MAX_WORDS, fit))


def split_year(title: str) -> tuple[str, str | None]:
    """``("Heat", "1995")`` for ``"Heat (1995)"``; the title and None without a trailing year."""
    m = _TITLE_YEAR.match(title)
    return (m.group(1), m.group(2)) if m else (title, None)


# what a user did, as an implicit history line says it, for common event names; another event reads as itself
ACTIONS = {
    "view": "viewed",
    "click": "clicked",
    "cart": "added to cart",
    "add_to_cart": "added to cart",
    "wishlist": "wishlisted",
    "purchase": "purchased",
    "buy": "bought",
    "order": "ordered",
    "like": "liked",
    "share": "shared",
    "play": "played",
    "listen": "listened to",
    "watch": "watched",
}


def action(event: str | None) -> str:
    """What an implicit history entry says the user did: ``purchased`` for ``purchase``, the event itself for
    names ``ACTIONS`` lacks, ``interacted with`` without an event."""
    if event is None:
        return "interacted with"
    return ACTIONS.get(event.strip().lower(), as_text(event))


def history_fields(e: HistoryEntry) -> dict[str, Any]:
    """One history entry as a template sees it: every field of the entry (``rating``, ...), ``title`` with the
    year split off into ``year``, text fields through :func:`as_text`; an implicit entry (``rating`` None) adds
    ``action`` (:func:`action`)."""
    title, year = split_year(e.title)
    fields = {**{k: _safe(v) for k, v in e._asdict().items()}, "title": as_text(title), "year": year}
    if e.rating is None:
        fields["action"] = action(e.event)
    return fields


def _render_user(
    entries: Sequence[HistoryEntry], template: PromptTemplate, max_words: int, fields: Mapping[str, Any]
) -> str:
    history = [history_fields(e) for e in entries]
    return template.render("user", {**fields, "history": history, "max_words": max_words})


def count_prompt_tokens(tokenizer: PreTrainedTokenizerBase, text: str, system: str | None = None) -> int:
    """Tokens of ``text`` as the engines prompt it (:func:`laser.models.chat_ids`: one chat-templated user
    message after the ``system`` message when given, or the plain text for a tokenizer without a chat
    template)."""
    from laser.models import chat_ids

    return len(chat_ids(tokenizer, text, system=system) if system is not None else chat_ids(tokenizer, text))


def user_prompt(
    history: Sequence[HistoryEntry | tuple[str, float]],
    domain: str = "movie",
    *,
    user_id: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    max_prompt_tokens: int | None = None,
    max_words: int = MAX_WORDS,
    template: PromptTemplate | None = None,
    user: Mapping[str, Any] | None = None,
) -> str:
    """The preference-analysis message for a history ordered oldest first, by ``template`` (default: the
    shipped one named ``domain``); ``user``: the user's attribute columns.

    With ``tokenizer`` and ``max_prompt_tokens`` the oldest entries are dropped until the prompt fits
    (module docstring); ``user_id`` only names the user in errors.
    """
    template = template or shipped_template(domain)
    entries = [HistoryEntry(*e) for e in history]
    who = f"user {user_id!r}" if user_id is not None else "user"
    if not entries:
        raise ValueError(f"{who} has an empty history; a preference prompt needs at least one entry")
    safe = {k: _safe(v) for k, v in (user or {}).items()}
    fields = {**safe, "user": safe, "user_id": as_text(user_id) if user_id is not None else None}
    if tokenizer is None or max_prompt_tokens is None:
        return _render_user(entries, template, max_words, fields)

    def fits(keep: int) -> bool:
        text = _render_user(entries[-keep:], template, max_words, fields)
        return count_prompt_tokens(tokenizer, text, template.system) <= max_prompt_tokens

    if not fits(1):
        raise PromptTooLongError(
            f"{who}: even the newest history entry {entries[-1].title!r} does not fit "
            f"max_prompt_tokens={max_prompt_tokens}"
        )
    lo, hi = 1, len(entries)  # invariant: fits(lo); token count grows with the number of entries kept
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return _render_user(entries[-lo:], template, max_words, fields)


def item_prompt(
    item: ItemRow, domain: str = "movie", max_words: int = MAX_WORDS, template: PromptTemplate | None = None
) -> str:
    """The description message for one item row (``title`` required; every column reaches the template,
    those of ``ITEM_FIELDS`` None where the row lacks them), by ``template`` (default: the shipped one named
    ``domain``)."""
    template = template or shipped_template(domain)
    title = item.get("title")
    if not title:
        raise ValueError(f"item {item.get('item_id')!r} has no title; an item prompt needs one")
    row = {**dict.fromkeys(ITEM_FIELDS), **{k: _safe(v) for k, v in item.items()}}
    return template.render("item", {**row, "item": row, "max_words": max_words})


def user_histories(interactions: pl.DataFrame, items: pl.DataFrame) -> dict[str, list[HistoryEntry]]:
    """Per user, ``HistoryEntry`` list ordered oldest first (by timestamp, then item_id).

    Titles carry the year (``display_title``), genres the item's first ``HISTORY_GENRES``; an
    interaction whose item is missing from ``items`` shows its item id as the title. Implicit interactions
    (a ``weight`` column) carry their event and weight. Equal entries are one shared object: a catalogue's
    histories cost a pointer an interaction.
    """
    extra = [c for c in ("year", "genres") if c in items.columns]
    feedback = [pl.col(c) if c in interactions.columns else pl.lit(None).alias(c) for c in ("event", "weight")]
    joined = (
        interactions.sort(["user_id", "timestamp", "item_id"])
        .join(items.select(["item_id", "title", *extra]), on="item_id", how="left", maintain_order="left")
        .select(
            "user_id",
            "item_id",
            "title",
            "rating",
            *(pl.col(c) if c in extra else pl.lit(None).alias(c) for c in ("year", "genres")),
            *feedback,
        )
    )
    entries: dict[tuple[str, float | None, str | None, float | None], HistoryEntry] = {}
    out: dict[str, list[HistoryEntry]] = {}
    for user, item, title, rating, year, genres, event, weight in joined.iter_rows():
        entry = entries.get((item, rating, event, weight))
        if entry is None:
            entry = entries[(item, rating, event, weight)] = HistoryEntry(
                display_title(title or item, year), rating, tuple((genres or [])[:HISTORY_GENRES]), event, weight
            )
        out.setdefault(user, []).append(entry)
    return out


def iter_item_prompts(items: pl.DataFrame, domain: str) -> Iterable[tuple[str, str]]:
    """(item_id, prompt) for every item row."""
    for row in items.iter_rows(named=True):
        yield row["item_id"], item_prompt(row, domain)


def task_template(task: DecodeTask) -> PromptTemplate:
    """The template a decode task prompts with: its own, else the shipped one of its domain."""
    return task.prompts if task.prompts is not None else shipped_template(task.domain)


def entity_prompt(task: DecodeTask, req: GenerationRequest, tokenizer: PreTrainedTokenizerBase) -> str:
    """The chat message for ``req`` (user histories truncated to ``max_prompt_tokens`` in ``tokenizer``'s
    tokens), holding no text ``tokenizer`` reads as a control token."""
    words, template = words_for_budget(task.max_new_tokens), task_template(task)
    if req.entity_type == "user":
        text = user_prompt(
            req.history or [],
            user_id=req.entity_id,
            tokenizer=tokenizer,
            max_prompt_tokens=task.max_prompt_tokens,
            max_words=words,
            template=template,
            user=req.user,
        )
    elif req.entity_type == "item":
        text = item_prompt(req.item or {"item_id": req.entity_id}, max_words=words, template=template)
    else:
        raise ValueError(f"unknown entity_type {req.entity_type!r}")
    return without_control(text, tokenizer)


def entity_input(task: DecodeTask, req: GenerationRequest, tokenizer: PreTrainedTokenizerBase) -> str | list[int]:
    """What the engines are handed for ``req``: the message text (they apply the chat template), or, with a
    system prompt, the token ids of the system and user messages through the chat template."""
    text, system = entity_prompt(task, req, tokenizer), task_template(task).system
    if system is None:
        return text
    from laser.models import chat_ids

    return chat_ids(tokenizer, text, system=system)
