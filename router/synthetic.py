"""Seeded interaction graphs with planted taste clusters, for the router's tests and benchmarks.

Users and items are split into ``n_clusters`` equal taste groups. A user rates mostly items of their own
group, highly, and some random items, lowly; item popularity inside a group is Zipf-like, so a
popularity baseline is meaningful but beatable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass
class PlantedGraph:
    """Canonical interactions plus the planted cluster of every user and item (the ground truth)."""

    interactions: pl.DataFrame
    user_cluster: dict[str, int]
    item_cluster: dict[str, int]


def planted_interactions(
    n_users: int = 943,
    n_items: int = 1682,
    n_ratings: int = 100_000,
    n_clusters: int = 5,
    in_cluster: float = 0.8,
    seed: int = 0,
) -> PlantedGraph:
    """Draw ``n_ratings`` distinct (user, item, rating, timestamp) rows with planted taste clusters.

    A share ``in_cluster`` of each user's ratings goes to their cluster's items (ratings 4-5), the rest
    to uniformly random items (ratings 1-3). Ids are strings ``u<n>`` / ``i<n>``.
    """
    rng = np.random.default_rng(seed)
    user_cluster = np.arange(n_users) % n_clusters
    item_cluster = np.arange(n_items) % n_clusters
    per_user = np.clip(rng.poisson(n_ratings / n_users, n_users), 5, n_items // n_clusters)
    rows_u, rows_i, rows_r = [], [], []
    for user in range(n_users):
        own = np.flatnonzero(item_cluster == user_cluster[user])
        popularity = 1.0 / np.arange(1, len(own) + 1) ** 0.8
        n_own = int(round(per_user[user] * in_cluster))
        liked = rng.choice(own, size=min(n_own, len(own)), replace=False, p=popularity / popularity.sum())
        other = rng.choice(n_items, size=per_user[user] - len(liked), replace=False)
        other = other[~np.isin(other, liked)]
        rows_u.append(np.full(len(liked) + len(other), user))
        rows_i.append(np.concatenate([liked, other]))
        rows_r.append(np.concatenate([rng.integers(4, 6, len(liked)), rng.integers(1, 4, len(other))]))
    users, items, ratings = (np.concatenate(x) for x in (rows_u, rows_i, rows_r))
    interactions = pl.DataFrame(
        {
            "user_id": [f"u{u}" for u in users],
            "item_id": [f"i{i}" for i in items],
            "rating": ratings.astype(np.float64),
            "timestamp": rng.integers(880_000_000, 890_000_000, len(users)),
        },
        schema={"user_id": pl.Utf8, "item_id": pl.Utf8, "rating": pl.Float64, "timestamp": pl.Int64},
    )
    return PlantedGraph(
        interactions,
        {f"u{u}": int(c) for u, c in enumerate(user_cluster)},
        {f"i{i}": int(c) for i, c in enumerate(item_cluster)},
    )
