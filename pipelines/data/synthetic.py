"""Seeded synthetic movie dataset: the embedded demo data (no files needed).

Structure the pipeline can exploit, planted on purpose:
- taste clusters: each cluster likes 2-3 genres; its users mostly pick items whose primary genre is one
  of them (``in_cluster_share``) and rate those high;
- item attributes: 1-3 genres per item, category = primary genre, sub_category = secondary genre, year;
- cold users (1-3 interactions) and cold items (0-2 interactions);
- user attributes: age, gender, occupation; strictly increasing timestamps per user.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from pipelines.data.config import SyntheticParams
from pipelines.data.schema import INTERACTIONS_SCHEMA, ITEM_COLUMNS, Dataset

GENRES = ["Action", "Adventure", "Animation", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
          "Horror", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western", "Musical"]
_ADJECTIVES = ["Silent", "Broken", "Golden", "Last", "Hidden", "Crimson", "Endless", "Lonely", "Frozen",
               "Wild", "Midnight", "Distant", "Burning", "Secret", "Restless", "Iron", "Paper", "Electric",
               "Quiet", "Forgotten", "Savage", "Velvet", "Hollow", "Bright"]
_NOUNS = ["Harbor", "Kingdom", "Road", "Garden", "Signal", "Empire", "River", "Storm", "Promise", "Mirror",
          "Frontier", "Station", "Island", "Detective", "Orchard", "Machine", "Summer", "Shadow", "Letter",
          "Circus", "Voyage", "Heart", "Tower", "Witness"]
_PLACES = ["Paris", "the North", "Mars", "Brooklyn", "Tokyo", "the Valley", "the Deep", "Casablanca",
           "Avalon", "the Border"]
OCCUPATIONS = ["student", "engineer", "artist", "educator", "doctor", "writer", "programmer", "retired",
               "salesman", "scientist", "lawyer", "technician", "homemaker", "administrator"]
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
        title = pat(_ADJECTIVES[rng.integers(len(_ADJECTIVES))], _NOUNS[rng.integers(len(_NOUNS))],
                    _PLACES[rng.integers(len(_PLACES))])
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
    return pl.DataFrame({
        "item_id": [f"i{k:04d}" for k in range(p.n_items)],
        "title": _titles(rng, p.n_items),
        "genres": genres,
        "category": [g[0] for g in genres],
        "sub_category": [g[1] if len(g) > 1 else None for g in genres],
        "year": rng.integers(1950, 2021, size=p.n_items).astype(np.int32),
    }, schema=ITEM_COLUMNS)


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


def generate(params: SyntheticParams | None = None, seed: int = 0) -> tuple[Dataset, pl.DataFrame]:
    """The dataset and the planted truth (user_id, cluster, liked_genres); same seed, same tables."""
    p = params or SyntheticParams()
    rng = np.random.default_rng(seed)
    items = _items(rng, p)
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

    rows: list[tuple[str, str, float, int]] = []
    for u in range(p.n_users):
        like = liked[clusters[u]]
        in_cluster = np.array([primary[k] in like for k in warm_items])
        n = int(rng.integers(1, 4)) if u in cold_users else int(rng.integers(p.min_history, p.max_history + 1))
        w = popularity * np.where(in_cluster, p.in_cluster_share / max(in_cluster.sum(), 1),
                                  (1 - p.in_cluster_share) / max((~in_cluster).sum(), 1))
        picks = rng.choice(warm_items, size=min(n, len(warm_items)), replace=False, p=w / w.sum())
        t = _T0 + int(rng.integers(0, 3 * 365 * 86_400))
        for k in picks:
            t += int(rng.integers(60, 7 * 86_400))
            rows.append((f"u{u:04d}", f"i{k:04d}", _rating(rng, item_genres[k], primary[k], like), t))
    # cold items: about half get one or two ratings from random warm users, the rest stay unseen
    warm_users = [u for u in range(p.n_users) if u not in cold_users] or list(range(p.n_users))
    for k in sorted(cold_items):
        for _ in range(int(rng.integers(0, 3))):
            u = int(rng.choice(warm_users))
            ts = _T0 + 3 * 365 * 86_400 + int(rng.integers(0, 365 * 86_400))
            rows.append((f"u{u:04d}", f"i{k:04d}", _rating(rng, item_genres[k], primary[k], liked[clusters[u]]), ts))

    interactions = (pl.DataFrame(rows, schema=INTERACTIONS_SCHEMA, orient="row")
                    .unique(subset=["user_id", "item_id"], keep="first", maintain_order=True)
                    .sort(["user_id", "timestamp", "item_id"]))
    users = pl.DataFrame({
        "user_id": [f"u{u:04d}" for u in range(p.n_users)],
        "age": rng.integers(16, 70, size=p.n_users).astype(np.int32),
        "gender": rng.choice(["F", "M"], size=p.n_users).tolist(),
        "occupation": rng.choice(OCCUPATIONS, size=p.n_users).tolist(),
    }, schema={"user_id": pl.Utf8, "age": pl.Int32, "gender": pl.Utf8, "occupation": pl.Utf8})
    truth = pl.DataFrame({
        "user_id": users["user_id"],
        "cluster": clusters.astype(np.int32),
        "liked_genres": [sorted(GENRES[g] for g in liked[c]) for c in clusters],
    })
    return Dataset(name="synthetic", domain="movie", interactions=interactions, items=items, users=users), truth


def synthetic_dataset(params: SyntheticParams | None = None, seed: int = 0) -> Dataset:
    """The embedded demo dataset (see the module docstring); deterministic per ``seed``."""
    return generate(params, seed)[0]
