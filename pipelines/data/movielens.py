"""MovieLens loaders: 100K (u.data/u.item/u.user), 1M and 10M (``::`` .dat files), latest (CSV).

The variant is detected from the files in the directory. Titles lose their trailing year into ``year``
(``"Usual Suspects, The (1995)"`` -> ``"The Usual Suspects"``, 1995); ``category`` is the first genre
and ``sub_category`` the second, the attribute groups of the LASER paper's MovieLens setting.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data.readers import DataFileError, coerce, drop_unknown_items, read_checked_csv, read_delimited
from pipelines.data.schema import Dataset, DType, conform_interactions, conform_items, conform_users
from pipelines.data.titles import split_title_year

log = logging.getLogger(__name__)

GENRES_100K = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
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
]
# users.dat occupation codes (ML-1M README)
OCCUPATIONS_1M = [
    "other",
    "academic/educator",
    "artist",
    "clerical/admin",
    "college/grad student",
    "customer service",
    "doctor/health care",
    "executive/managerial",
    "farmer",
    "homemaker",
    "K-12 student",
    "lawyer",
    "programmer",
    "retired",
    "sales/marketing",
    "scientist",
    "self-employed",
    "technician/engineer",
    "tradesman/craftsman",
    "unemployed",
    "writer",
]
NO_GENRES = "(no genres listed)"

_RATING_NAMES = ["user_id", "item_id", "rating", "timestamp"]
_RATING_TYPES: dict[str, DType] = {"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64, "timestamp": pl.Int64}


def detect_variant(directory: Path) -> str:
    """ "100k", "1m", "10m" or "latest" from the files present in ``directory``."""
    if (directory / "u.data").exists():
        return "100k"
    if (directory / "ratings.dat").exists():
        return "1m" if (directory / "users.dat").exists() else "10m"
    if (directory / "ratings.csv").exists():
        return "latest"
    raise FileNotFoundError(f"{directory} holds no MovieLens ratings file (u.data, ratings.dat or ratings.csv)")


def load_movielens(path: Path) -> Dataset:
    """Load a MovieLens directory (or a file inside one) of any supported variant."""
    directory = path if path.is_dir() else path.parent
    variant = detect_variant(directory)
    log.info("reading MovieLens %s from %s", variant, directory)
    notes: dict[str, Any] = {}
    users: pl.DataFrame | None  # None: the variant has no users file
    if variant == "100k":
        inter, items, users = _read_100k(directory, notes)
        ratings = directory / "u.data"
    elif variant in ("1m", "10m"):
        inter, items, users = _read_dat(directory, notes)
        ratings = directory / "ratings.dat"
    else:
        inter, items, users = _read_latest(directory, notes)
        ratings = directory / "ratings.csv"
    inter = conform_interactions(drop_unknown_items(inter, items, ratings, notes).drop("line_no"))
    if users is None:
        users = inter.select("user_id").unique().sort("user_id")
    return Dataset(
        name=f"ml-{variant}",
        domain="movie",
        interactions=inter,
        items=conform_items(items),
        users=conform_users(users),
        notes=notes,
    )


def _genre_list(column: str, separator: str = "|") -> pl.Expr:
    """Split a genres string; the "(no genres listed)" marker becomes an empty list."""
    return (
        pl.col(column)
        .str.split(separator)
        .list.eval(pl.element().filter((pl.element() != NO_GENRES) & (pl.element() != "")))
        .alias("genres")
    )


def _read_100k(d: Path, notes: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    inter = read_delimited(
        d / "u.data", "\t", _RATING_NAMES, _RATING_TYPES, _RATING_NAMES, keep_line_no=True, notes=notes
    )
    flags = [f"g{k}" for k in range(len(GENRES_100K))]
    raw = read_delimited(
        d / "u.item",
        "|",
        ["item_id", "title", "release_date", "video_release", "url", *flags],
        {"item_id": pl.Utf8, "title": pl.Utf8},
        ["item_id", "title"],
        notes=notes,
    )
    genres = pl.concat_list(pl.when(pl.col(f) == "1").then(pl.lit(g)) for f, g in zip(flags, GENRES_100K))
    items = (
        raw.with_columns(
            *split_title_year("title"),
            genres.list.drop_nulls().alias("genres"),
        )
        .with_columns(
            pl.col("year").fill_null(pl.col("release_date").str.slice(-4).cast(pl.Int32, strict=False)),
        )
        .select("item_id", "title", "genres", "year", pl.col("url").alias("imdb_url"))
    )
    users = read_delimited(
        d / "u.user",
        "|",
        ["user_id", "age", "gender", "occupation", "zip_code"],
        {"user_id": pl.Utf8, "age": pl.Int32},
        ["user_id"],
        notes=notes,
    )
    return inter, items, users


def _read_dat(d: Path, notes: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    inter = read_delimited(
        d / "ratings.dat", "::", _RATING_NAMES, _RATING_TYPES, _RATING_NAMES, keep_line_no=True, notes=notes
    )
    movies = read_delimited(
        d / "movies.dat",
        "::",
        ["item_id", "title", "genres"],
        {"item_id": pl.Utf8, "title": pl.Utf8},
        ["item_id", "title"],
        notes=notes,
    )
    items = movies.with_columns(*split_title_year("title"), _genre_list("genres"))
    users: pl.DataFrame | None = None
    if (d / "users.dat").exists():
        users = read_delimited(
            d / "users.dat",
            "::",
            ["user_id", "gender", "age", "occupation", "zip_code"],
            {"user_id": pl.Utf8, "age": pl.Int32, "occupation": pl.Int32},
            ["user_id"],
            notes=notes,
        )
        users = users.with_columns(
            pl.col("occupation").replace_strict(
                list(range(len(OCCUPATIONS_1M))), OCCUPATIONS_1M, default=None, return_dtype=pl.Utf8
            )
        )
    return inter, items, users


def _read_csv(
    path: Path, names: dict[str, str], dtypes: dict[str, DType], required: list[str], notes: dict[str, Any]
) -> pl.DataFrame:
    """A headed MovieLens CSV, source columns renamed per ``names``, with ``line_no`` (header = line 1);
    bad rows skipped and reported (``read_checked_csv``)."""
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    frame = read_checked_csv(path, ",", notes)
    missing = [c for c in names if c not in frame.columns]
    if missing:
        raise DataFileError(f"{path}: missing column(s) {missing}; found {frame.columns[:-1]}")
    frame = frame.select(*(pl.col(src).alias(dst) for src, dst in names.items()), "line_no")
    return coerce(
        frame, dtypes, required, path, keep_row_no=True, notes=notes, names={dst: src for src, dst in names.items()}
    )


def _read_latest(d: Path, notes: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame, None]:
    inter = _read_csv(
        d / "ratings.csv",
        {"userId": "user_id", "movieId": "item_id", "rating": "rating", "timestamp": "timestamp"},
        _RATING_TYPES,
        _RATING_NAMES,
        notes,
    )
    movies = _read_csv(
        d / "movies.csv",
        {"movieId": "item_id", "title": "title", "genres": "genres"},
        {"item_id": pl.Utf8, "title": pl.Utf8},
        ["item_id", "title"],
        notes,
    ).drop("line_no")
    items = movies.with_columns(*split_title_year("title"), _genre_list("genres"))
    return inter, items, None
