"""Text-quality figures of generated knowledge: how it ended, repetition, fragments, length and grounding.

Rules (documented in docs/knowledge-quality.md):

- **words**: lower-cased runs of letters/digits/apostrophes (``\\w+(?:'\\w+)*``); punctuation is ignored.
- **repeat_4gram**: repeated / all word 4-grams, where a 4-gram is repeated when it already occurred earlier in
  the same text (0.0 for a text of fewer than 4 words), computed as one float division of two counts.
- **degenerate**: fewer than ``MIN_WORDS`` words, or repeated / all >= ``MAX_REPEAT_4GRAM`` compared EXACTLY
  (as fractions): 1 repeat in 5 4-grams is degenerate, a stored 0.2 always means degenerate.
- **sentence end**: the text, stripped, ends with ``.``, ``!`` or ``?`` (closing quotes/brackets after it allowed).
- **ended**: finished by EOS or a stop string, or it ends at a sentence end (within the budget, which it always is).
- **cut**: stopped at the token limit and not at a sentence end.
- **surely degenerate** (:func:`surely_degenerate`): degenerate now and whatever follows within the token
  limit; the knowledge job stops such a first text early (finish reason ``loop``), as it is retried anyway.
- **fragment**: not at a sentence end, unbalanced brackets or double quotes, or garbage (fewer than
  ``MIN_LETTER_SHARE`` of its non-space characters are letters).
- **length**: ``n_words`` against ``asked_words`` (the prompt's "at most N words"; 0 when unknown).
- **grounding** (:func:`user_grounding`, :func:`item_grounding`): matched / mentioned facts, None when the text
  mentions none; item texts count brands and prices too where the items table has those columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Literal, Mapping, Sequence

import polars as pl

NGRAM = 4
MAX_REPEAT_4GRAM = 0.2  # at least a fifth of the 4-grams are repeats: the text loops
_MAX_REPEAT = Fraction(1, 5)  # the same threshold, compared exactly
MIN_WORDS = 3
MIN_LETTER_SHARE = 0.6
DegeneratePolicy = Literal["retry", "keep", "retry_greedy", "fail"]
GREEDY_RETRY_DECODER = "autoregressive"
_WORD = re.compile(r"\w+(?:'\w+)*")
_CLOSERS = "\"'”’)]"  # what may follow a sentence's final mark


def words(text: str) -> list[str]:
    """The text's words, lower-cased (see the module docstring)."""
    return _WORD.findall(text.lower())


def _repeat_counts(text: str, n: int = NGRAM) -> tuple[int, int]:
    """(repeated, all) word ``n``-grams of ``text``."""
    return _word_repeats(words(text), n)


def _word_repeats(ws: Sequence[str], n: int = NGRAM) -> tuple[int, int]:
    total = max(0, len(ws) - n + 1)
    return total - len(set(zip(*(ws[i:] for i in range(n))))), total


def surely_degenerate(text: str, more_words: int) -> bool:
    """Whether ``text`` followed by anything of at most ``more_words`` words is degenerate (its loop can no
    longer be outgrown).

    The text's last word may still grow, so it is set aside: the 4-grams of the other words are the first
    4-grams of every continuation and their repeats stay repeats, while a continuation has at most
    ``kept + 1 + more_words`` words. The text itself is then degenerate too.
    """
    kept = words(text)[:-1]
    repeated, _ = _word_repeats(kept)
    most = len(kept) + 1 + more_words - (NGRAM - 1)
    return repeated > 0 and Fraction(repeated, most) >= _MAX_REPEAT


def words_per_token(tokenizer) -> int:
    """The most words one token can add to a text: the most any vocabulary entry's text holds, at least 1
    (a word split over tokens starts in one of them)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return max(1, max(len(_WORD.findall(t)) for t in texts))


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """Share of the word ``n``-grams of ``text`` that repeat an earlier one (0.0 with fewer than n words)."""
    rep, total = _repeat_counts(text, n)
    return rep / total if total else 0.0


def ends_sentence(text: str) -> bool:
    """The stripped text ends with sentence-final punctuation (closing quotes/brackets allowed after it)."""
    return text.strip().rstrip(_CLOSERS).endswith((".", "!", "?"))


def fragment_reason(text: str) -> str | None:
    """Why ``text`` reads as a fragment or garbage (module docstring), or None."""
    body = text.strip()
    if not ends_sentence(body):
        return "does not end at a sentence end"
    pairs = (("(", ")"), ("[", "]"))
    if any(body.count(a) != body.count(b) for a, b in pairs) or body.count('"') % 2:
        return "unbalanced brackets or quotes"
    letters, visible = _letter_counts(body)
    if visible and letters / visible < MIN_LETTER_SHARE:
        return f"fewer than {MIN_LETTER_SHARE:.0%} of its characters are letters"
    return None


_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())  # \x1c-\x1f too, as str.isspace has them
_ASCII_LETTERS = bytes(c for c in range(128) if chr(c).isalpha())


def _letter_counts(text: str) -> tuple[int, int]:
    """(letters, non-space characters) of ``text`` as ``str.isalpha`` / ``str.isspace`` count them; an ASCII
    text is counted by two byte deletions (C speed), any other character by character."""
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw) - len(raw.translate(None, _ASCII_LETTERS)), len(raw.translate(None, _ASCII_SPACE))
    return sum(map(str.isalpha, text)), len(text) - sum(map(str.isspace, text))


@dataclass(frozen=True)
class TextQuality:
    """The quality fields of one knowledge row (grounding None: not measured or nothing mentioned)."""

    finished_eos: bool
    repeat_4gram: float
    degenerate: bool
    ended: bool | None = None
    cut: bool | None = None
    fragment: bool | None = None
    n_words: int | None = None
    asked_words: int | None = None
    grounding: "Grounding | None" = None

    @property
    def flawed(self) -> bool:
        """Degenerate, cut or a fragment: what the retry policy regenerates."""
        return bool(self.degenerate or self.cut or self.fragment)

    def reason(self) -> str:
        """Why the text is flawed (for failure records and logs)."""
        if self.degenerate:
            return (
                f"degenerate text: {self.repeat_4gram:.0%} of its word 4-grams repeat "
                f"(limit {MAX_REPEAT_4GRAM:.0%}) or it has fewer than {MIN_WORDS} words"
            )
        if self.cut:
            return "cut text: stopped at the token limit mid-sentence"
        return "fragment: does not end at a sentence end, unbalanced brackets/quotes or few letters"


def text_quality(
    text: str, finish_reason: str, asked_words: int | None = None, grounding: "Grounding | None" = None
) -> TextQuality:
    """Score one generated text; ``finish_reason`` is the decoder's (``eos`` or ``length``)."""
    ws = words(text)
    rep, total = _word_repeats(ws)
    n_words = len(ws)
    at_end = ends_sentence(text)
    loops = total > 0 and rep * _MAX_REPEAT.denominator >= _MAX_REPEAT.numerator * total  # rep/total >= 1/5, exact
    return TextQuality(
        finished_eos=finish_reason == "eos",
        repeat_4gram=rep / total if total else 0.0,
        degenerate=n_words < MIN_WORDS or loops,
        ended=finish_reason in ("eos", "stop") or at_end,
        cut=finish_reason == "length" and not at_end,
        fragment=fragment_reason(text) is not None,
        n_words=n_words,
        asked_words=asked_words,
        grounding=grounding,
    )


# ---- grounding ---------------------------------------------------------------------------------------

# Genre names a text may mention (MovieLens, the synthetic demo, common book genres); the entity's own
# genres are always added. A mention of one of these that the input does not support is ungrounded.
KNOWN_GENRES = (
    "Action",
    "Adventure",
    "Animation",
    "Children",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
    "Biography",
    "History",
    "Science Fiction",
    "Poetry",
    "Memoir",
)
# written forms of a genre beyond "<genre>" and its plural; "war" counts only as a genre phrase
_GENRE_FORMS = {
    "sci-fi": ("sci-fi", "science fiction", "science-fiction"),
    "science fiction": ("sci-fi", "science fiction", "science-fiction"),
    "film-noir": ("film-noir", "film noir", "noir"),
    "animation": ("animation", "animated"),
    "children": ("children's", "children", "family"),
    "comedy": ("comedy", "comedies"),
    "mystery": ("mystery", "mysteries"),
    "war": ("war film", "war films", "war movie", "war movies", "war genre", "war drama", "war dramas"),
    "history": ("historical",),
    "biography": ("biography", "biographies", "biopic", "biopics"),
}
_RATING = re.compile(r"(?<![\w.])(\d(?:\.5)?)\s*(?:-|\s)?(?:stars?\b|/\s*5\b|out of 5\b)", re.I)
_QUOTED = re.compile(r"[\"“]([^\"”\n]{2,80})[\"”]")
_YEAR = re.compile(r"\b(1[89]\d\d|20\d\d)s?\b")
_TITLE_YEAR = re.compile(r"\((1[89]\d\d|20\d\d)\)")


@dataclass
class Grounding:
    """Facts a text mentions and how many of them the input supports, per kind (titles, genres, ratings, years,
    brands, prices)."""

    mentioned: dict[str, int] = field(default_factory=dict)
    matched: dict[str, int] = field(default_factory=dict)
    unsupported_genres: list[str] = field(default_factory=list)  # genres named that the input does not have

    def add(self, kind: str, ok: bool) -> None:
        self.mentioned[kind] = self.mentioned.get(kind, 0) + 1
        self.matched[kind] = self.matched.get(kind, 0) + int(ok)

    def add_genre(self, genre: str, ok: bool) -> None:
        self.add("genres", ok)
        if not ok:
            self.unsupported_genres.append(genre)

    @property
    def n_mentioned(self) -> int:
        return sum(self.mentioned.values())

    @property
    def n_matched(self) -> int:
        return sum(self.matched.values())

    @property
    def share(self) -> float | None:
        """matched / mentioned, None when the text mentions nothing checkable."""
        return self.n_matched / self.n_mentioned if self.n_mentioned else None


def _norm_title(title: str) -> str:
    """Lower-cased title without its year, a trailing ", The"/", A" moved to the front, spaces squeezed."""
    t = _TITLE_YEAR.sub("", title).strip().lower()
    m = re.match(r"^(.*), (the|a|an)$", t)
    if m:
        t = f"{m.group(2)} {m.group(1)}"
    return " ".join(re.sub(r"[^\w' ]", " ", t).split())


def genre_forms(genre: str) -> tuple[str, ...]:
    """The lower-case words that name ``genre`` (``comedy``: comedy, comedies)."""
    g = genre.lower()
    return _GENRE_FORMS.get(g, (g, g + "s"))


def _genre_mentions(text: str, vocabulary: Iterable[str]) -> set[str]:
    """Canonical (lower-case) genres of ``vocabulary`` that ``text`` names."""
    low = text.lower()
    found: set[str] = set()
    for genre in vocabulary:
        if any(_same_genre(genre.lower(), f) for f in found):
            continue  # one genre under two names (Sci-Fi, Science Fiction) is one mention
        if any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", low) for f in genre_forms(genre)):
            found.add(genre.lower())
    return found


def _same_genre(a: str, b: str) -> bool:
    return a == b or set(genre_forms(a)) & set(genre_forms(b)) != set()


def _blank(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """``text`` with the character ranges ``spans`` replaced by spaces."""
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


def _vocabulary(extra: Iterable[str]) -> list[str]:
    seen: dict[str, str] = {g.lower(): g for g in KNOWN_GENRES}
    seen.update({g.lower(): g for g in extra})
    return list(seen.values())


def entity_genres(entity_type: str, history: Sequence[tuple] | None = None, item: Mapping | None = None) -> list[str]:
    """The genres a user's history or an item's attributes have (what :func:`user_grounding` and
    :func:`item_grounding` match genre mentions against)."""
    if entity_type == "user" and history:
        return sorted({x for e in history if len(e) > 2 for x in (e[2] or ())})
    if entity_type == "item" and item:
        return list(item.get("genres") or []) + [item[k] for k in ("category", "sub_category") if item.get(k)]
    return []


def unsupported_genres(
    entity_type: str, history: Sequence[tuple] | None = None, item: Mapping | None = None
) -> list[str]:
    """Every genre (``KNOWN_GENRES`` and the entity's own) whose mention the grounding of this entity's text
    would count as unsupported; none when its input has no genres."""
    own = entity_genres(entity_type, history, item)
    low = {x.lower() for x in own}
    return [g for g in _vocabulary(own) if not any(_same_genre(g.lower(), h) for h in low)] if own else []


def user_grounding(text: str, history: Sequence[tuple], genres: Iterable[str] = ()) -> Grounding:
    """How well a user profile sticks to the user's history (entries ``(title, rating[, genres])``).

    Titles: every quoted span, every history title named without quotes; matched when it is a history
    title (year optional, ", The" order ignored). Genres: every genre name (``KNOWN_GENRES`` + ``genres`` +
    the history's) the text names; matched when a history entry has it. Ratings (``4.5 stars``, ``4/5``):
    matched when the closest history title named before it within the same sentence has that rating, or,
    when no title precedes, when any history entry has it.
    """
    g = Grounding()
    low = text.lower()
    # implicit feedback has no rating (None): a rating the text names is then unsupported
    ratings = {_norm_title(e[0]): float(e[1]) if e[1] is not None else None for e in history}
    hist_genres = {x.lower() for x in entity_genres("user", history)}
    spans: list[tuple[int, str | None]] = []  # (end offset, matched history title or None) of title mentions
    vocab = _vocabulary(list(genres) + sorted(hist_genres))
    quoted: list[tuple[int, int]] = []
    for m in _QUOTED.finditer(text):
        key = _norm_title(m.group(1))
        if _genre_mentions(m.group(1), vocab) and key not in ratings and len(key.split()) <= 2:
            continue  # a quoted genre ("comedy") is not a title
        g.add("titles", key in ratings)
        spans.append((m.end(), key if key in ratings else None))
        quoted.append((m.start(), m.end()))
    titled = list(quoted)  # where titles stand: genre words inside them are not genre mentions
    for key in ratings:
        for m in re.finditer(rf"(?<!\w){re.escape(key)}(?!\w)", low):
            if not any(a <= m.start() < b for a, b in quoted):
                g.add("titles", True)
                spans.append((m.end(), key))
                titled.append((m.start(), m.end()))
    spans.sort()
    for genre in _genre_mentions(_blank(text, titled), vocab):
        g.add_genre(genre, any(_same_genre(genre, h) for h in hist_genres))
    for m in _RATING.finditer(text):
        value = float(m.group(1))
        sentence_start = max(text.rfind(c, 0, m.start()) for c in ".!?\n") + 1
        before = [key for end, key in spans if sentence_start <= end <= m.start()]
        if before:
            g.add("ratings", before[-1] is not None and ratings[before[-1]] == value)
        else:
            g.add("ratings", value in ratings.values())
    return g


def item_grounding(text: str, item: Mapping, genres: Iterable[str] = (), brands: Iterable[str] = ()) -> Grounding:
    """How well an item description agrees with the item's attributes.

    Genres: every genre name (``KNOWN_GENRES`` + ``genres``) the text names; matched when the item has it
    (genres, category or sub-category). Years: every year (``1995``, ``1990s``) the text names; matched when it is
    the item's year (a decade matches the year's decade). Brands and prices: :func:`_commerce_facts`, when
    the item has a ``brand`` or ``price`` column. Skipped for attributes the item lacks.
    """
    g = Grounding()
    own = entity_genres("item", item=item)
    if own:
        own_low = {x.lower() for x in own}
        for genre in _genre_mentions(text, _vocabulary(list(genres) + own)):
            g.add_genre(genre, any(_same_genre(genre, h) for h in own_low))
    year = item.get("year")
    if year:
        for m in _YEAR.finditer(text):
            said = int(m.group(1))
            g.add("years", said == int(year) if not m.group(0).endswith("s") else said == int(year) // 10 * 10)
    _commerce_facts(g, text, item, brands)
    return g


# ---- brands and prices (e-commerce items) ---------------------------------------------------------------

MIN_BRAND_CHARS = 3
# brand values that name no brand, or that any product text uses as ordinary words
NOT_BRANDS = frozenset(
    {"generic", "unknown", "unbranded", "no brand", "none", "n/a", "various", "other", "misc", "brand", "gift card"}
)
_AMOUNT = r"(\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?)"
_MONEY = re.compile(rf"(?:US\s?\$|\$|\bUSD\s?){_AMOUNT}(?!\d)|(?<![\w.,]){_AMOUNT}\s?(?:dollars?|USD|bucks)\b", re.I)


def _brand_key(brand: object) -> str | None:
    """A brand as matched (lower case, spaces squeezed), or None for one too short or naming no brand."""
    key = " ".join(str(brand).lower().split()) if brand is not None else ""
    return key if len(key) >= MIN_BRAND_CHARS and key not in NOT_BRANDS else None


def catalogue_brands(items: pl.DataFrame) -> tuple[str, ...]:
    """The brands of the items table (its ``brand`` column; none without one) that a text's brand mention is
    matched against, lower-cased, without too short ones and non-brands (``NOT_BRANDS``)."""
    if "brand" not in items.columns:
        return ()
    return tuple(sorted({k for b in items["brand"].drop_nulls().unique().to_list() if (k := _brand_key(b))}))


def money_amounts(text: str) -> list[float]:
    """Every money amount ``text`` states (``$12.99``, ``US$5``, ``12.99 dollars``, ``USD 12``, ``$1,299``)."""
    return [float((m.group(1) or m.group(2)).replace(",", "")) for m in _MONEY.finditer(text)]


def _same_price(said: float, price: float) -> bool:
    return abs(said - price) <= max(0.01, 0.01 * abs(price)) + 1e-9


def _commerce_facts(g: Grounding, text: str, item: Mapping, brands: Iterable[str]) -> None:
    """Brand facts: every catalogue brand (``brands`` + the item's own; longest first, whole words, any case)
    the text names, matched when it is the item's brand or its title names it. Price facts (items with a
    ``price`` column): every money amount the text states, matched when within 1% (at least 1 cent) of the
    item's price or an amount its title states; an item without a price supports no other amount."""
    title = str(item.get("title") or "")
    own = _brand_key(item.get("brand"))
    vocab = {k for b in brands if (k := _brand_key(b)) is not None} | ({own} if own else set())
    if vocab:
        low, title_low = text.lower(), " ".join(title.lower().split())
        for brand in sorted(vocab, key=len, reverse=True):
            if brand.split()[0] not in low:
                continue  # a cheap test first: catalogues hold thousands of brands
            pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, brand.split())) + r"(?!\w)"
            if re.search(pattern, low):
                g.add("brands", brand == own or re.search(pattern, title_low) is not None)
                low = re.sub(pattern, " ", low)  # a shorter brand inside this one is not a second mention
    if "price" in item:
        price, shown = item.get("price"), money_amounts(title)
        for said in money_amounts(text):
            g.add("prices", any(_same_price(said, p) for p in ([price] if price is not None else []) + shown))


# ---- knowledge rows ----------------------------------------------------------------------------------


def entity_quality(
    text: str,
    finish_reason: str,
    entity_type: str,
    history: Sequence[tuple] | None = None,
    item: Mapping | None = None,
    asked_words: int | None = None,
    brands: Iterable[str] = (),
) -> TextQuality:
    """:func:`text_quality` with the grounding of a user (``history``) or item (``item``) text; ``brands``:
    the catalogue's (:func:`catalogue_brands`)."""
    if entity_type == "user" and history:
        grounding = user_grounding(text, history)
    elif entity_type == "item" and item:
        grounding = item_grounding(text, item, brands=brands)
    else:
        grounding = None
    return text_quality(text, finish_reason, asked_words, grounding)


def quality_columns(q: TextQuality) -> dict[str, object]:
    """The knowledge-store quality columns of one row (pipelines/knowledge_store.py, ``KnowledgeRow``)."""
    g = q.grounding
    return {
        "finished_eos": q.finished_eos,
        "repeat_4gram": q.repeat_4gram,
        "degenerate": q.degenerate,
        "ended": q.ended,
        "cut": q.cut,
        "fragment": q.fragment,
        "n_words": q.n_words,
        "asked_words": q.asked_words,
        "facts_mentioned": g.n_mentioned if g is not None else None,
        "grounding": g.share if g is not None else None,
    }


def row_quality(row: Mapping) -> TextQuality:
    """The quality of a stored row from its columns (grounding as one aggregate kind, ``facts``)."""
    g = None
    if row.get("facts_mentioned"):
        n = int(row["facts_mentioned"])
        g = Grounding({"facts": n}, {"facts": round((row.get("grounding") or 0.0) * n)})
    return TextQuality(
        row["finished_eos"],
        row["repeat_4gram"],
        row["degenerate"],
        row.get("ended"),
        row.get("cut"),
        row.get("fragment"),
        row.get("n_words"),
        row.get("asked_words"),
        g,
    )


# ---- summaries -------------------------------------------------------------------------------------


@dataclass
class QualitySummary:
    """Quality over many texts: counts, the mean repeat share, length against the ask and grounding."""

    n: int = 0
    finished_eos: int = 0
    degenerate: int = 0
    repeat_4gram_sum: float = 0.0
    ended: int = 0
    cut: int = 0
    fragment: int = 0
    over_budget: int = 0  # more words than asked
    length_ratio_sum: float = 0.0
    length_ratio_n: int = 0
    mentioned: int = 0
    matched: int = 0
    grounding_by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [matched, mentioned]

    def add(self, q: TextQuality) -> None:
        self.n += 1
        self.finished_eos += bool(q.finished_eos)
        self.degenerate += bool(q.degenerate)
        self.repeat_4gram_sum += q.repeat_4gram or 0.0
        self.ended += bool(q.ended)
        self.cut += bool(q.cut)
        self.fragment += bool(q.fragment)
        if q.asked_words and q.n_words is not None:
            self.over_budget += q.n_words > q.asked_words
            self.length_ratio_sum += q.n_words / q.asked_words
            self.length_ratio_n += 1
        if q.grounding is not None:
            self.mentioned += q.grounding.n_mentioned
            self.matched += q.grounding.n_matched
            for kind, n in q.grounding.mentioned.items():
                slot = self.grounding_by_kind.setdefault(kind, [0, 0])
                slot[0] += q.grounding.matched[kind]
                slot[1] += n

    @property
    def eos_share(self) -> float:
        return self.finished_eos / self.n if self.n else 0.0

    @property
    def mean_repeat_4gram(self) -> float:
        return self.repeat_4gram_sum / self.n if self.n else 0.0

    @property
    def grounding(self) -> float | None:
        """Matched / mentioned facts over all texts (None: nothing mentioned)."""
        return self.matched / self.mentioned if self.mentioned else None

    def as_dict(self) -> dict[str, object]:
        def share(k: int) -> float:
            return round(k / self.n, 4) if self.n else 0.0

        return {
            "n": self.n,
            "finished_eos": self.finished_eos,
            "eos_share": round(self.eos_share, 4),
            "degenerate": self.degenerate,
            "mean_repeat_4gram": round(self.mean_repeat_4gram, 4),
            "ended": self.ended,
            "ended_share": share(self.ended),
            "cut": self.cut,
            "cut_share": share(self.cut),
            "fragment": self.fragment,
            "degenerate_share": share(self.degenerate),
            "over_budget": self.over_budget,
            "mean_length_ratio": round(self.length_ratio_sum / self.length_ratio_n, 4) if self.length_ratio_n else None,
            "facts_mentioned": self.mentioned,
            "facts_matched": self.matched,
            "grounding": round(self.grounding, 4) if self.grounding is not None else None,
            "grounding_by_kind": {
                k: {"matched": m, "mentioned": n} for k, (m, n) in sorted(self.grounding_by_kind.items())
            },
        }


def summarise_quality(texts: Iterable[str], finish_reasons: Iterable[str]) -> QualitySummary:
    """Quality of a set of generations (e.g. one decoder's outputs in a benchmark)."""
    out = QualitySummary()
    for text, reason in zip(texts, finish_reasons, strict=True):
        out.add(text_quality(text, reason))
    return out
