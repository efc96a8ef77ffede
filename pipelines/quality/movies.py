"""Grounding of user profiles and item descriptions in titles, genres, ratings and years (movies, books), with
the brands and prices of e-commerce items where the items table has them (:mod:`pipelines.quality.commerce`)."""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from pipelines.quality.commerce import commerce_facts
from pipelines.quality.facts import Grounding

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
    commerce_facts(g, text, item, brands)
    return g
