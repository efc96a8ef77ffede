"""Guessing a table job's ``dataset:`` block from the tables themselves (``laser init``).

Only the schemas and a small sample are read: Parquet footers plus the first rows of a few files spread over
the table (pyarrow ``head``), or the first lines of one CSV/TSV/JSON-lines file. Every guess carries the
evidence it rests on (a column's name, type, distinct values in the sample), which the config writer turns
into comments; where two readings fit, one is picked and the other named in a note.
"""

from __future__ import annotations

import dataclasses
import io
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipelines.data.readers import DataFileError
from pipelines.data.table_files import TableSource, _dataset, locate

SAMPLE_ROWS = 20_000  # rows read from a table at most
SAMPLE_FILES = 8  # files the sample is spread over
TEXT_BYTES = 4 << 20  # bytes read from the start of a CSV/JSON-lines file

# name patterns (lower case, "-" and " " read as "_"), best first
USER_NAMES = (
    "user_id",
    "userid",
    "user",
    "uid",
    "customer_id",
    "customerid",
    "customer",
    "reviewer_id",
    "reviewerid",
    "visitor_id",
    "visitorid",
    "member_id",
    "account_id",
    "client_id",
    "reader_id",
)
ITEM_NAMES = (
    "item_id",
    "itemid",
    "item",
    "iid",
    "product_id",
    "productid",
    "product",
    "movie_id",
    "movieid",
    "book_id",
    "bookid",
    "isbn",
    "asin",
    "sku",
    "article_id",
    "articleid",
    "news_id",
    "newsid",
    "content_id",
    "video_id",
    "track_id",
    "song_id",
    "listing_id",
    "offer_id",
    "doc_id",
    "parent_asin",
)
TIME_NAMES = (
    "timestamp",
    "ts",
    "time",
    "datetime",
    "event_time",
    "eventtime",
    "date",
    "created_at",
    "unix_time",
    "unixreviewtime",
    "time_stamp",
    "event_timestamp",
    "day",
    "dt",
)
RATING_NAMES = ("rating", "ratings", "stars", "star_rating", "score", "overall", "rate", "review_score")
WEIGHT_NAMES = (
    "weight",
    "count",
    "quantity",
    "qty",
    "clicks",
    "views",
    "plays",
    "play_count",
    "playcount",
    "dwell",
    "dwell_time",
    "dwell_seconds",
    "duration",
    "watch_time",
    "listen_count",
    "times",
    "n",
)
EVENT_NAMES = (
    "event",
    "event_type",
    "eventtype",
    "action",
    "action_type",
    "interaction",
    "interaction_type",
    "behavior",
    "behaviour",
    "behavior_type",
    "activity",
    "type",
)
TITLE_NAMES = (
    "title",
    "name",
    "product_name",
    "product_title",
    "movie_title",
    "book_title",
    "headline",
    "item_name",
    "display_name",
)
GENRE_NAMES = ("genres", "genre", "tags", "categories", "topics", "keywords")
CATEGORY_NAMES = ("category", "main_category", "main_cat", "department", "section", "vertical", "cat")
SUB_NAMES = ("sub_category", "subcategory", "subcat", "sub_cat", "subgenre")
YEAR_NAMES = ("year", "release_year", "pub_year", "publication_year", "year_of_publication")
ECOMMERCE_HINTS = ("brand", "price", "store", "manufacturer", "seller")
NEWS_HINTS = ("abstract", "body", "summary", "article", "content", "text")
BOOK_HINTS = ("author", "authors", "isbn", "publisher")
# implicit events a shop logs, strongest first (weights a team may well change)
EVENT_WEIGHTS = {
    "purchase": 3.0,
    "buy": 3.0,
    "order": 3.0,
    "transaction": 3.0,
    "checkout": 3.0,
    "cart": 2.0,
    "addtocart": 2.0,
    "add_to_cart": 2.0,
    "like": 2.0,
    "favorite": 2.0,
    "share": 2.0,
    "rate": 2.0,
    "review": 2.0,
    "click": 1.0,
    "play": 1.0,
    "read": 1.0,
    "watch": 1.0,
    "view": 0.5,
    "pageview": 0.5,
    "impression": 0.25,
}
STRFTIME = (
    "%d/%m/%Y",
    "%m/%d/%Y",
    "%Y/%m/%d",
    "%d.%m.%Y",
    "%Y%m%d",
    "%d-%m-%Y",
    "%m-%d-%Y",
    "%d/%m/%Y %H:%M:%S",
    "%m/%d/%Y %H:%M:%S",
    "%d/%m/%Y %H:%M",
    "%m/%d/%Y %H:%M",
)
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$")
TITLE_YEAR = re.compile(r"\((1[89]\d\d|20\d\d)\)\s*$")


@dataclass(frozen=True)
class Sample:
    """A table's full schema and its first rows (``rows``: how many were read)."""

    label: str
    schema: dict[str, pl.DataType]
    frame: pl.DataFrame

    def seen(self, column: str) -> str:
        """What the sample shows of ``column``: its type and distinct values (e.g. "int64, 6040 distinct")."""
        dtype = str(self.schema[column]).lower()
        if column not in self.frame.columns:
            return f"column {column!r} ({dtype})"
        values = self.frame[column]
        distinct = values.n_unique() if not values.dtype.is_nested() else values.cast(pl.Utf8, strict=False).n_unique()
        return f"column {column!r} ({dtype}, {distinct} distinct in {self.frame.height} sampled rows)"


@dataclass
class Guess:
    """The ``dataset:`` keys guessed, each with a comment saying what it rests on, and the prompt template."""

    keys: dict[str, Any] = field(default_factory=dict)  # dotted under dataset (columns.user_id, feedback, ...)
    why: dict[str, str] = field(default_factory=dict)  # dotted key -> the evidence
    template: str = "movie"
    template_why: str = ""
    notes: list[str] = field(default_factory=list)  # ambiguities resolved, things left out

    def set(self, key: str, value: Any, why: str) -> None:
        self.keys[key], self.why[key] = value, why


def sample_table(where: str, key: str) -> Sample:
    """``where``'s schema and at most SAMPLE_ROWS of its rows, the first of each of a few files spread over the
    table (never the whole table); ``key``: the option messages name (e.g. ``--items``)."""
    src = locate(where, key)
    if src.parquet:
        schema = pl.Schema(_dataset(src).schema)
        files = _spread(src.files, SAMPLE_FILES)
        heads = [
            pl.from_arrow(_dataset(dataclasses.replace(src, files=(f,))).head(SAMPLE_ROWS // len(files))) for f in files
        ]
        frame = pl.concat([h for h in heads if isinstance(h, pl.DataFrame)], how="diagonal_relaxed")
        return Sample(str(src.label), dict(schema), frame)
    frame = _text_head(src)
    return Sample(str(src.label), dict(frame.schema), frame)


def _spread(files: tuple[str, ...], n: int) -> tuple[str, ...]:
    """At most ``n`` of ``files``, evenly spaced (the first and the last among them)."""
    if len(files) <= n:
        return files
    step = (len(files) - 1) / (n - 1)
    return tuple(files[round(i * step)] for i in range(n))


def _text_head(src: TableSource) -> pl.DataFrame:
    """The first lines of one CSV/TSV/JSON-lines file (its last partial line dropped)."""
    path = src.files[0]
    name = posixpath.basename(path).lower()
    with src.fs.open(path, "rb", compression="gzip" if name.endswith(".gz") else None) as fh:
        raw = fh.read(TEXT_BYTES)
    if len(raw) == TEXT_BYTES:
        raw = raw[: raw.rfind(b"\n") + 1]
    name = name.removesuffix(".gz")
    try:
        if name.endswith((".jsonl", ".ndjson")):
            return pl.read_ndjson(io.BytesIO(raw)).head(SAMPLE_ROWS)
        sep = "\t" if name.endswith(".tsv") else ","
        return pl.read_csv(io.BytesIO(raw), separator=sep, n_rows=SAMPLE_ROWS, infer_schema_length=SAMPLE_ROWS)
    except pl.exceptions.PolarsError as err:
        raise DataFileError(f"{src.label}: unreadable ({str(err).splitlines()[0]})") from err


def _norm(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def _by_name(columns: Iterable[str], names: tuple[str, ...], taken: Iterable[str] = ()) -> list[str]:
    """The columns whose name is one of ``names``, best first (an exact name before ``<name>_id``-like ones)."""
    cols = [c for c in columns if c not in set(taken)]
    found = [c for n in names for c in cols if _norm(c) == n]
    found += [c for n in names for c in cols if _norm(c).endswith("_" + n) and c not in found and len(n) > 2]
    return list(dict.fromkeys(found))


def _numeric(dtype: pl.DataType) -> bool:
    return dtype.is_numeric()


def _pick(guess: Guess, key: str, found: list[str], sample: Sample, what: str) -> str | None:
    """The first of ``found`` as ``columns.<key>``, naming the runners-up in a note."""
    if not found:
        return None
    guess.set(f"columns.{key}", found[0], sample.seen(found[0]))
    if len(found) > 1:
        guess.notes.append(f"{what}: picked column {found[0]!r} over {', '.join(map(repr, found[1:]))}")
    return found[0]


def guess_interactions(sample: Sample, guess: Guess) -> None:
    """Ids, time and feedback from the interactions' sample; no user or item id is a ``DataFileError``."""
    cols = list(sample.schema)
    user = _pick(guess, "user_id", _by_name(cols, USER_NAMES), sample, "user id")
    item = _pick(guess, "item_id", _by_name(cols, ITEM_NAMES, {user} if user else set()), sample, "item id")
    if user is None or item is None:
        missing = " and ".join(k for k, c in (("a user id", user), ("an item id", item)) if c is None)
        raise DataFileError(
            f"{sample.label}: found no column for {missing} among its columns {cols}; name them, e.g. "
            "user_id and item_id, or write dataset.columns by hand (jobs/configs/table.yaml)"
        )
    taken = {user, item}
    _guess_time(sample, guess, [c for c in cols if c not in taken])
    taken.add(guess.keys["columns.timestamp"])
    ratings = [c for c in _by_name(cols, RATING_NAMES, taken) if _numeric(sample.schema[c])]
    if ratings:
        rating = _pick(guess, "rating", ratings, sample, "rating")
        assert rating is not None
        guess.set("feedback", "explicit", f"a rating column ({rating!r})")
        scale = _rating_scale(sample.frame[rating]) if rating in sample.frame.columns else None
        if scale is not None:
            guess.set("rating_scale", list(scale), f"sampled ratings lie in {list(scale)}")
            guess.set("min_positive_rating", _positive(scale), "the upper part of the scale counts as liked")
        if left := _by_name(cols, EVENT_NAMES + WEIGHT_NAMES, taken | {rating}):
            guess.notes.append(f"explicit feedback reads ratings only: column(s) {left} not used")
        return
    guess.set("feedback", "implicit", f"no rating column among {cols}: clicks, views or purchases")
    weights = [c for c in _by_name(cols, WEIGHT_NAMES, taken) if _numeric(sample.schema[c])]
    _pick(guess, "weight", weights, sample, "weight")
    events = [c for c in _by_name(cols, EVENT_NAMES, taken) if sample.schema[c] in (pl.Utf8, pl.Categorical)]
    if event := _pick(guess, "event", events, sample, "event"):
        _event_weights(sample, guess, event)


def _guess_time(sample: Sample, guess: Guess, cols: list[str]) -> None:
    """``columns.timestamp`` and ``timestamp_format``: a date/datetime column, unix seconds, or dated text."""
    named = _by_name(cols, TIME_NAMES)
    typed = [c for c in cols if isinstance(sample.schema[c], (pl.Date, pl.Datetime)) and c not in named]
    for column in named + typed:
        dtype, values = sample.schema[column], sample.frame.get_column(column, default=None)
        if isinstance(dtype, (pl.Date, pl.Datetime)):
            guess.set("columns.timestamp", column, sample.seen(column) + ": dates, converted to unix seconds")
            return
        if _numeric(dtype):
            guess.set("columns.timestamp", column, sample.seen(column) + ": " + _epoch_unit(values))
            guess.set("timestamp_format", "epoch", "numbers: unix seconds")
            return
        if dtype == pl.Utf8 and values is not None and (fmt := _text_time(values)) is not None:
            guess.set("columns.timestamp", column, sample.seen(column))
            guess.set("timestamp_format", fmt[0], fmt[1])
            if len(fmt) > 2:
                guess.notes.append(fmt[2])
            return
    raise DataFileError(
        f"{sample.label}: found no time column (unix seconds, a date or datetime, or dated text) among {cols}; "
        "the job orders each user's history by it: add one, or set dataset.columns.timestamp by hand"
    )


def _epoch_unit(values: pl.Series | None) -> str:
    top = values.drop_nulls().abs().max() if values is not None and values.len() else None
    if isinstance(top, (int, float)) and top > 1e11:
        return "numbers this large look like unix milliseconds: read as seconds, the order is kept, dates are not"
    return "unix seconds"


def _text_time(values: pl.Series) -> tuple[str, ...] | None:
    """(timestamp_format, why[, a note]) for text times: digits, ISO 8601, or the strftime formats that read
    every sampled value (the first when several do: 01/02/2024 reads both ways)."""
    text = values.drop_nulls().str.strip_chars()
    text = text.filter(text != "").head(2000)
    if text.len() == 0:
        return None
    if text.str.contains(r"^-?\d{9,11}$").all():
        return ("epoch", "text of unix seconds")
    if text.str.contains(ISO.pattern).all():
        return ("iso", f"ISO 8601 text, e.g. {text[0]!r}")
    fits = [f for f in STRFTIME if text.str.strptime(pl.Datetime, f, strict=False, exact=True).null_count() == 0]
    if not fits:
        return None
    why = f"text dates such as {text[0]!r}"
    if len(fits) == 1:
        return (fits[0], why)
    return (fits[0], why, f"timestamp_format: every sampled date reads as {' or '.join(fits)}; picked {fits[0]}")


def _rating_scale(values: pl.Series) -> tuple[float, float] | None:
    """The usual scale holding the sampled ratings: [1, 5], [0, 5], [1, 10], [0, 10], [0, 100], else none."""
    clean = values.drop_nulls()
    if clean.len() == 0:
        return None
    low, high = float(clean.min()), float(clean.max())  # type: ignore[arg-type]
    for scale in ((1, 5), (0, 5), (1, 10), (0, 10), (0, 100)):
        if scale[0] <= low and high <= scale[1]:
            return (float(scale[0]), float(scale[1]))
    return None


def _positive(scale: tuple[float, float]) -> float:
    """The rating from which a rating counts as liked: 4 of 5, 8 of 10, the upper fifth above."""
    return round(scale[0] + 0.75 * (scale[1] - scale[0]), 1)


def _event_weights(sample: Sample, guess: Guess, event: str) -> None:
    """``event_weights`` for the sampled events: known kinds weighted (purchase 3 ... view 0.5), others 1."""
    if event not in sample.frame.columns:
        return
    values = sample.frame[event].cast(pl.Utf8).drop_nulls().str.strip_chars()
    seen = sorted(v for v in values.unique().to_list() if v)
    if not seen or len(seen) > 30:
        return
    weights = {v: EVENT_WEIGHTS.get(_norm(v).replace("_", ""), EVENT_WEIGHTS.get(_norm(v), 1.0)) for v in seen}
    guess.set(
        "event_weights",
        weights,
        f"the {len(seen)} events sampled; a stronger action weighs more (edit freely); rows with an event not "
        "listed are skipped and counted",
    )


def guess_items(sample: Sample, guess: Guess) -> None:
    """The items' id, title and attributes, and from them the prompt template."""
    cols = list(sample.schema)
    item = guess.keys.get("columns.item_id")
    if item not in sample.schema:
        other = _by_name(cols, ITEM_NAMES)
        seen = f"; it has {other[0]!r}: rename one of the two" if other else ""
        raise DataFileError(
            f"{sample.label}: no column {item!r} (the interactions' item id; the job reads one name in both tables) "
            f"among its columns {cols}{seen}"
        )
    taken = {item}
    guess.why["items_file"] = f"{len(cols)} columns, {sample.frame.height} items sampled"
    titles = [c for c in _by_name(cols, TITLE_NAMES, taken) if sample.schema[c] == pl.Utf8]
    title = _pick(guess, "title", titles or _longest_text(sample, taken), sample, "title")
    if title is None:
        guess.notes.append(f"{sample.label}: no title column: the item id is each item's title")
        guess.keys["items_file"] = None
        return
    taken.add(title)
    genres = _pick(guess, "genres", _by_name(cols, GENRE_NAMES, taken), sample, "genres")
    if genres is not None:
        taken.add(genres)
        if sample.schema[genres] == pl.Utf8:
            sep = _separator(sample.frame[genres]) if genres in sample.frame.columns else "|"
            guess.set("genres_separator", sep, f"the separator most common in column {genres!r}")
    for key, names in (("category", CATEGORY_NAMES), ("sub_category", SUB_NAMES)):
        if (found := _pick(guess, key, _by_name(cols, names, taken), sample, key)) is not None:
            taken.add(found)
    years = [c for c in _by_name(cols, YEAR_NAMES, taken) if _numeric(sample.schema[c])]
    if (year := _pick(guess, "year", years, sample, "year")) is not None:
        taken.add(year)
    titled_years = title in sample.frame.columns and _share(sample.frame[title], TITLE_YEAR) >= 0.8
    if titled_years and year is None:
        guess.notes.append(f"titles end in a year in parentheses (column {title!r}): the prompts show it there")
    rest = [c for c in cols if c not in taken]
    if rest:
        guess.notes.append(f"item columns kept as attributes (a template may show them): {rest}")
    _template(guess, [_norm(c) for c in cols], genres is not None, titled_years or year is not None)


def _template(guess: Guess, names: list[str], genres: bool, years: bool) -> None:
    """The shipped template the items' columns fit (there is no generic one: movie is the fallback)."""
    hit = lambda hints: [n for n in names if n in hints]  # noqa: E731
    if (news := hit(NEWS_HINTS)) and "columns.category" in guess.keys:
        guess.template, guess.template_why = "news", f"articles: columns {news} and a category"
    elif shop := hit(ECOMMERCE_HINTS):
        guess.template, guess.template_why = "ecommerce", f"products: columns {shop}"
    elif books := hit(BOOK_HINTS):
        guess.template, guess.template_why = "book", f"books: columns {books}"
    elif genres and years:
        guess.template, guess.template_why = "movie", "films: genres, and titles with years"
    else:
        guess.template, guess.template_why = (
            "movie",
            "no column marks a domain (brand/price: ecommerce, abstract: news, author: book, genres with years: "
            "movie) and no generic template ships: movie's wording, which says 'movie'; write your own "
            "(docs/prompts.md) if that reads wrong",
        )


def _longest_text(sample: Sample, taken: set[str]) -> list[str]:
    """Text columns other than ``taken``, longest average value first (a title when no column is named one)."""
    texts = [c for c in sample.frame.columns if c not in taken and sample.frame.schema[c] == pl.Utf8]
    lengths = {c: sample.frame[c].str.len_chars().mean() or 0 for c in texts}
    return sorted((c for c in texts if float(lengths[c]) >= 4), key=lambda c: -float(lengths[c]))[:1]  # type: ignore[arg-type]


def _separator(values: pl.Series) -> str:
    text = values.drop_nulls().head(2000)
    counts = {sep: int(text.str.count_matches(re.escape(sep)).sum()) for sep in ("|", ",", ";", "/")}
    best = max(counts, key=lambda s: counts[s])
    return best if counts[best] else "|"


def _share(values: pl.Series, pattern: re.Pattern[str]) -> float:
    text = values.drop_nulls().cast(pl.Utf8)
    return int(text.str.contains(pattern.pattern).sum()) / text.len() if text.len() else 0.0


def guess_users(sample: Sample, guess: Guess) -> None:
    """The users table must share the interactions' user id column; its other columns are attributes."""
    user = guess.keys["columns.user_id"]
    if user not in sample.schema:
        raise DataFileError(
            f"{sample.label}: no column {user!r} (the interactions' user id) among its columns {list(sample.schema)}"
        )
    rest = [c for c in sample.schema if c != user]
    guess.notes.append(f"user columns kept as attributes (a template may show them): {rest}")
    guess.why["users_file"] = f"{sample.frame.height} users sampled"


def guess_dataset(data: str, items: str | None = None, users: str | None = None) -> Guess:
    """Every guess for the tables at ``data`` (interactions), ``items`` and ``users`` (files, folders, globs
    or URIs)."""
    guess = Guess()
    inter = sample_table(data, "DATA")
    guess_interactions(inter, guess)
    guess.why["path"] = f"{len(inter.schema)} columns, {inter.frame.height} rows sampled"
    if items is not None:
        guess_items(sample_table(items, "--items"), guess)
    else:
        guess.notes.append("no --items table: each item's id is its title")
        _template(guess, [], False, False)
    if users is not None:
        guess_users(sample_table(users, "--users"), guess)
    return guess
