"""Seeded synthetic movie dataset: the embedded demo data (no files needed).

Structure the pipeline can exploit, planted on purpose:
- taste clusters: each cluster likes 2-3 genres; its users mostly pick items whose primary genre is one
  of them (``in_cluster_share``) and rate those high;
- item attributes: 1-3 genres per item, category = primary genre, sub_category = secondary genre, year;
- cold users (1-3 interactions) and cold items (0-2 interactions);
- user attributes: age, gender, occupation; strictly increasing timestamps per user.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipelines.data.config import SyntheticParams
from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS, Dataset

GENRES = [
    "Action",
    "Adventure",
    "Animation",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Horror",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
    "Musical",
]
_ADJECTIVES = [
    "Silent",
    "Broken",
    "Golden",
    "Last",
    "Hidden",
    "Crimson",
    "Endless",
    "Lonely",
    "Frozen",
    "Wild",
    "Midnight",
    "Distant",
    "Burning",
    "Secret",
    "Restless",
    "Iron",
    "Paper",
    "Electric",
    "Quiet",
    "Forgotten",
    "Savage",
    "Velvet",
    "Hollow",
    "Bright",
]
_NOUNS = [
    "Harbor",
    "Kingdom",
    "Road",
    "Garden",
    "Signal",
    "Empire",
    "River",
    "Storm",
    "Promise",
    "Mirror",
    "Frontier",
    "Station",
    "Island",
    "Detective",
    "Orchard",
    "Machine",
    "Summer",
    "Shadow",
    "Letter",
    "Circus",
    "Voyage",
    "Heart",
    "Tower",
    "Witness",
]
_PLACES = [
    "Paris",
    "the North",
    "Mars",
    "Brooklyn",
    "Tokyo",
    "the Valley",
    "the Deep",
    "Casablanca",
    "Avalon",
    "the Border",
]
OCCUPATIONS = [
    "student",
    "engineer",
    "artist",
    "educator",
    "doctor",
    "writer",
    "programmer",
    "retired",
    "salesman",
    "scientist",
    "lawyer",
    "technician",
    "homemaker",
    "administrator",
]
_T0 = 946_684_800  # 2000-01-01 UTC


def _titles(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct titles from a few word patterns."""
    patterns = [
        lambda a, b, p: f"The {a} {b}",
        lambda a, b, p: f"{a} {b}",
        lambda a, b, p: f"{b} of {p}",
        lambda a, b, p: f"The {b} in {p}",
        lambda a, b, p: f"A {a} {b}",
    ]
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        pat = patterns[rng.integers(len(patterns))]
        title = pat(
            _ADJECTIVES[rng.integers(len(_ADJECTIVES))],
            _NOUNS[rng.integers(len(_NOUNS))],
            _PLACES[rng.integers(len(_PLACES))],
        )
        if title in seen:  # the pattern space is large; fall back to a sequel number when it collides
            title = f"{title} {2 + sum(t.startswith(title) for t in seen)}"
        seen.add(title)
        out.append(title)
    return out


def _items(rng: np.random.Generator, p: SyntheticParams) -> pl.DataFrame:
    primary = rng.integers(len(GENRES), size=p.n_items)
    genres: list[list[str]] = []
    for g in primary:
        extra = rng.choice([x for x in range(len(GENRES)) if x != g], size=rng.integers(0, 3), replace=False)
        genres.append([GENRES[g]] + [GENRES[x] for x in extra])
    return pl.DataFrame(
        {
            "item_id": [f"i{k:04d}" for k in range(p.n_items)],
            "title": _titles(rng, p.n_items),
            "genres": genres,
            "category": [g[0] for g in genres],
            "sub_category": [g[1] if len(g) > 1 else None for g in genres],
            "year": rng.integers(1950, 2021, size=p.n_items).astype(np.int32),
        },
        schema=ITEM_COLUMNS,
    )


def _cluster_genres(rng: np.random.Generator, n_clusters: int) -> list[set[int]]:
    """2-3 liked genres per cluster, primary genres spread across clusters."""
    order = rng.permutation(len(GENRES))
    liked = []
    for c in range(n_clusters):
        size = 2 + int(rng.integers(2))
        liked.append({int(order[(c * 3 + j) % len(GENRES)]) for j in range(size)})
    return liked


def _rating(rng: np.random.Generator, item_genres: set[int], primary: int, liked: set[int]) -> float:
    """Cluster taste: high for a liked primary genre, middling for any liked genre, low otherwise."""
    mean = 4.5 if primary in liked else (3.5 if item_genres & liked else 2.2)
    return float(np.clip(np.rint(mean + rng.normal(0.0, 0.6)), 1, 5))


@dataclass
class _Planted:
    """The planted structure ``generate`` draws interactions from (indices into GENRES, items, users)."""

    item_genres: list[set[int]]  # each item's genres
    primary: list[int]  # each item's primary genre
    cold_items: set[int]
    warm_items: np.ndarray
    popularity: np.ndarray  # pick weight of each warm item
    liked: list[set[int]]  # each cluster's liked genres
    clusters: np.ndarray  # each user's cluster
    cold_users: set[int]


def _plant(rng: np.random.Generator, p: SyntheticParams, items: pl.DataFrame) -> _Planted:
    """Cold items, warm item popularity, cluster tastes, user clusters and cold users (in this draw order)."""
    g_index = {g: k for k, g in enumerate(GENRES)}
    item_genres = [{g_index[g] for g in gs} for gs in items["genres"].to_list()]
    primary = [g_index[g] for g in items["category"].to_list()]
    n_cold_items = int(round(p.cold_item_fraction * p.n_items))
    cold_items = set(rng.choice(p.n_items, size=n_cold_items, replace=False).tolist())
    warm_items = np.array([k for k in range(p.n_items) if k not in cold_items])
    popularity = 1.0 / (1.0 + rng.permutation(len(warm_items))) ** 0.6  # mild long tail
    liked = _cluster_genres(rng, p.n_clusters)
    clusters = rng.integers(p.n_clusters, size=p.n_users)
    n_cold_users = int(round(p.cold_user_fraction * p.n_users))
    cold_users = set(rng.choice(p.n_users, size=n_cold_users, replace=False).tolist())
    return _Planted(item_genres, primary, cold_items, warm_items, popularity, liked, clusters, cold_users)


def _user_rows(rng: np.random.Generator, p: SyntheticParams, s: _Planted) -> list[tuple[str, str, float, int]]:
    """Every user's history: mostly warm items of their cluster's genres, at increasing timestamps."""
    rows: list[tuple[str, str, float, int]] = []
    for u in range(p.n_users):
        like = s.liked[s.clusters[u]]
        in_cluster = np.array([s.primary[k] in like for k in s.warm_items])
        n = int(rng.integers(1, 4)) if u in s.cold_users else int(rng.integers(p.min_history, p.max_history + 1))
        w = s.popularity * np.where(
            in_cluster,
            p.in_cluster_share / max(in_cluster.sum(), 1),
            (1 - p.in_cluster_share) / max((~in_cluster).sum(), 1),
        )
        picks = rng.choice(s.warm_items, size=min(n, len(s.warm_items)), replace=False, p=w / w.sum())
        t = _T0 + int(rng.integers(0, 3 * 365 * 86_400))
        for k in picks:
            t += int(rng.integers(60, 7 * 86_400))
            rows.append((f"u{u:04d}", f"i{k:04d}", _rating(rng, s.item_genres[k], s.primary[k], like), t))
    return rows


def _cold_item_rows(rng: np.random.Generator, p: SyntheticParams, s: _Planted) -> list[tuple[str, str, float, int]]:
    """Cold items: about half get one or two ratings from random warm users, the rest stay unseen."""
    rows: list[tuple[str, str, float, int]] = []
    warm_users = [u for u in range(p.n_users) if u not in s.cold_users] or list(range(p.n_users))
    for k in sorted(s.cold_items):
        for _ in range(int(rng.integers(0, 3))):
            u = int(rng.choice(warm_users))
            ts = _T0 + 3 * 365 * 86_400 + int(rng.integers(0, 365 * 86_400))
            rating = _rating(rng, s.item_genres[k], s.primary[k], s.liked[s.clusters[u]])
            rows.append((f"u{u:04d}", f"i{k:04d}", rating, ts))
    return rows


def generate(params: SyntheticParams | None = None, seed: int = 0) -> tuple[Dataset, pl.DataFrame]:
    """The dataset and the planted truth (user_id, cluster, liked_genres); same seed, same tables."""
    p = params or SyntheticParams()
    rng = np.random.default_rng(seed)
    items = _items(rng, p)
    planted = _plant(rng, p, items)
    rows = _user_rows(rng, p, planted)
    rows += _cold_item_rows(rng, p, planted)
    interactions = (
        pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row")
        .unique(subset=["user_id", "item_id"], keep="first", maintain_order=True)
        .sort(["user_id", "timestamp", "item_id"])
    )
    users = pl.DataFrame(
        {
            "user_id": [f"u{u:04d}" for u in range(p.n_users)],
            "age": rng.integers(16, 70, size=p.n_users).astype(np.int32),
            "gender": rng.choice(["F", "M"], size=p.n_users).tolist(),
            "occupation": rng.choice(OCCUPATIONS, size=p.n_users).tolist(),
        },
        schema={"user_id": pl.Utf8, "age": pl.Int32, "gender": pl.Utf8, "occupation": pl.Utf8},
    )
    clusters, liked = planted.clusters, planted.liked
    truth = pl.DataFrame(
        {
            "user_id": users["user_id"],
            "cluster": clusters.astype(np.int32),
            "liked_genres": [sorted(GENRES[g] for g in liked[c]) for c in clusters],
        }
    )
    return Dataset(name="synthetic", domain="movie", interactions=interactions, items=items, users=users), truth


def synthetic_dataset(params: SyntheticParams | None = None, seed: int = 0) -> Dataset:
    """The embedded demo dataset (see the module docstring); deterministic per ``seed``."""
    return generate(params, seed)[0]


def _ids(prefix: str, n: int) -> pl.Series:
    """``prefix`` + zero-padded 0..n-1 (so string order is numeric order)."""
    width = len(str(max(n - 1, 0)))
    digits = pl.int_range(n, dtype=pl.Int64).cast(pl.Utf8).str.zfill(width)
    return pl.select(pl.format(f"{prefix}{{}}", digits)).to_series()


def _scale_items(rng: np.random.Generator, n_items: int) -> pl.DataFrame:
    """Items with 1-3 genres (primary drawn by a skewed genre popularity), a unique title and a year."""
    genre_p = 1.0 / np.arange(1, len(GENRES) + 1)
    primary = rng.choice(len(GENRES), size=n_items, p=genre_p / genre_p.sum())
    offsets = rng.permuted(np.tile(np.arange(1, len(GENRES)), (n_items, 1)), axis=1)[:, :2]  # two distinct others
    n_extra = rng.integers(0, 3, size=n_items)
    names = np.array(GENRES)
    frame = pl.DataFrame(
        {
            "item_id": _ids("i", n_items),
            "n_extra": n_extra,
            "g0": names[primary],
            "x1": names[(primary + offsets[:, 0]) % len(GENRES)],
            "x2": names[(primary + offsets[:, 1]) % len(GENRES)],
            "adj": np.array(_ADJECTIVES)[rng.integers(len(_ADJECTIVES), size=n_items)],
            "noun": np.array(_NOUNS)[rng.integers(len(_NOUNS), size=n_items)],
            "year": rng.integers(1950, 2021, size=n_items).astype(np.int32),
        }
    )
    frame = frame.with_columns(
        g1=pl.when(pl.col("n_extra") > 0).then("x1"), g2=pl.when(pl.col("n_extra") > 1).then("x2")
    )
    return frame.select(
        "item_id",
        title=pl.concat_str("adj", "noun", pl.col("item_id").str.slice(1), separator=" "),  # the id keeps it unique
        genres=pl.concat_list("g0", "g1", "g2").list.drop_nulls(),
        category="g0",
        sub_category="g1",
        year="year",
    ).cast(pl.Schema(ITEM_COLUMNS))


def scale_catalogue(
    n_users: int,
    n_items: int,
    mean_history: float = 20.0,
    seed: int = 0,
    popularity_exponent: float = 1.0,
    activity_sigma: float = 1.0,
) -> Dataset:
    """A large synthetic catalogue in time and memory linear in users + items + interactions (no users x items).

    - activity: each user's interaction count is lognormal (``activity_sigma``) with mean ``mean_history``,
      at least 1 and at most ``n_items``: heavy-tailed, most users have a few, a few have thousands;
    - popularity: every interaction picks its item from a power law over a random rank order of the items,
      P(rank r) ~ 1 / r ** ``popularity_exponent`` (numpy's vectorised ``choice``); a user's repeated picks
      of one item collapse to one interaction, so a user has at most their count;
    - ratings: a user bias, an item quality and a bonus on the user's favourite genre, plus noise, 1-5;
    - timestamps strictly increasing per user; user attributes gender, age, occupation.
    Canonical tables (pipelines/data/schema.py); same arguments, same tables.
    """
    if n_users < 1 or n_items < 1 or mean_history <= 0:
        raise ValueError(
            f"scale_catalogue needs n_users, n_items >= 1 and mean_history > 0, got "
            f"{n_users}, {n_items}, {mean_history}"
        )
    rng = np.random.default_rng(seed)
    items = _scale_items(rng, n_items)
    user_ids, item_ids = _ids("u", n_users), _ids("i", n_items)
    interactions = _scale_interactions(
        rng, items, user_ids, item_ids, mean_history, popularity_exponent, activity_sigma
    )
    return Dataset(
        name=f"scale-{n_users}u-{n_items}i",
        domain="movie",
        interactions=interactions,
        items=items,
        users=_scale_users(rng, user_ids),
        notes={"generator": "scale_catalogue", "seed": seed, "mean_history": mean_history},
    )


def _scale_interactions(
    rng: np.random.Generator,
    items: pl.DataFrame,
    user_ids: pl.Series,
    item_ids: pl.Series,
    mean_history: float,
    popularity_exponent: float,
    activity_sigma: float,
) -> pl.DataFrame:
    """Lognormal activity per user, power-law item picks, rated by user bias, item quality and favourite
    genre (see :func:`scale_catalogue`); a user's repeated picks of one item keep the first."""
    n_users, n_items = len(user_ids), len(item_ids)
    mu = np.log(mean_history) - activity_sigma**2 / 2  # lognormal mean = exp(mu + sigma^2 / 2)
    counts = np.clip(np.rint(rng.lognormal(mu, activity_sigma, size=n_users)), 1, n_items).astype(np.int64)
    total = int(counts.sum())
    user = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    weights = 1.0 / np.arange(1, n_items + 1) ** popularity_exponent
    item = rng.permutation(n_items)[rng.choice(n_items, size=total, p=weights / weights.sum())]
    favourite = rng.integers(len(GENRES), size=n_users)
    primary = pl.Series(items["category"]).replace_strict(GENRES, list(range(len(GENRES))), return_dtype=pl.Int64)
    score = (
        3.2
        + rng.normal(0, 0.5, n_users)[user]
        + rng.normal(0, 0.6, n_items)[item]
        + 0.8 * (primary.to_numpy()[item] == favourite[user])
        + rng.normal(0, 0.7, total)
    )
    return pl.DataFrame(
        {
            "user_id": user_ids.gather(user),
            "item_id": item_ids.gather(item),
            "rating": np.clip(np.rint(score), 1, 5),
            "timestamp": _scale_timestamps(rng, counts, user),
        },
        schema=INTERACTIONS_SCHEMA,
    ).unique(subset=["user_id", "item_id"], keep="first", maintain_order=True)


def _scale_timestamps(rng: np.random.Generator, counts: np.ndarray, user: np.ndarray) -> np.ndarray:
    """Strictly increasing timestamps per user: random gaps summed from each user's random start."""
    gaps = rng.integers(60, 7 * 86_400, size=len(user))
    clock = np.cumsum(gaps)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    start = _T0 + rng.integers(0, 3 * 365 * 86_400, size=len(counts))
    return start[user] + clock - (clock - gaps)[first][user]  # each user's clock from their own start


def _scale_users(rng: np.random.Generator, user_ids: pl.Series) -> pl.DataFrame:
    """User attributes: age, gender and occupation drawn uniformly."""
    n_users = len(user_ids)
    return pl.DataFrame(
        {
            "user_id": user_ids,
            "age": rng.integers(16, 70, size=n_users).astype(np.int32),
            "gender": np.array(["F", "M"])[rng.integers(2, size=n_users)],
            "occupation": np.array(OCCUPATIONS)[rng.integers(len(OCCUPATIONS), size=n_users)],
        },
        schema={"user_id": pl.Utf8, "age": pl.Int32, "gender": pl.Utf8, "occupation": pl.Utf8},
    )
