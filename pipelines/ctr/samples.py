"""CTR samples from rating histories, and the seeded train/validation/test split by user.

One sample per interaction in the NEW part of a user's history: the label is ``rating >= threshold``;
the features are the target item and the user's ``history_len`` interactions just before it (old
and new history together, in timestamp order) with their ratings.
"""

from __future__ import annotations

import numpy as np
import polars as pl

SAMPLE_COLUMNS = ("user_id", "item_id", "label", "hist_items", "hist_ratings")


def build_samples(
    old_interactions: pl.DataFrame, new_interactions: pl.DataFrame, rating_threshold: float = 4.0, history_len: int = 5
) -> pl.DataFrame:
    """Return samples: user_id, item_id, label (Int8), hist_items (List[Utf8]), hist_ratings (List[Float64]).

    History lists are oldest-first and hold at most ``history_len`` entries (fewer at the start of a
    history). Ties in timestamp keep the input order.
    """
    cols = ["user_id", "item_id", "rating", "timestamp"]
    for name, frame in (("old_interactions", old_interactions), ("new_interactions", new_interactions)):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} lacks column(s) {missing}; has {frame.columns}")
    both = pl.concat(
        [
            old_interactions.select(cols).with_columns(pl.lit(False).alias("is_new")),
            new_interactions.select(cols).with_columns(pl.lit(True).alias("is_new")),
        ],
        how="vertical_relaxed",
    )
    both = both.with_row_index("_order").sort(["user_id", "timestamp", "_order"])
    lag_items = [pl.col("item_id").shift(k).over("user_id") for k in range(history_len, 0, -1)]
    lag_ratings = [pl.col("rating").shift(k).over("user_id") for k in range(history_len, 0, -1)]
    samples = both.with_columns(
        pl.concat_list(lag_items).list.drop_nulls().alias("hist_items"),
        pl.concat_list(lag_ratings).list.drop_nulls().alias("hist_ratings"),
    ).filter(pl.col("is_new"))
    return samples.select(
        pl.col("user_id").cast(pl.Utf8),
        pl.col("item_id").cast(pl.Utf8),
        (pl.col("rating") >= rating_threshold).cast(pl.Int8).alias("label"),
        "hist_items",
        "hist_ratings",
    )


def split_by_user(
    samples: pl.DataFrame, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> dict[str, pl.DataFrame]:
    """Split samples into ``train``/``val``/``test`` by user (a user's samples stay in one part), seeded."""
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
        raise ValueError(f"split fractions must be three positive numbers summing to 1, got {fractions}")
    users = np.array(sorted(samples["user_id"].unique().to_list()), dtype=object)
    if len(users) < 3:
        raise ValueError(f"need at least 3 users to split by user, got {len(users)}")
    users = users[np.random.default_rng(seed).permutation(len(users))]
    n_train = max(1, round(fractions[0] * len(users)))
    n_val = max(1, round(fractions[1] * len(users)))
    n_train = min(n_train, len(users) - n_val - 1)
    parts = {"train": users[:n_train], "val": users[n_train : n_train + n_val], "test": users[n_train + n_val :]}
    return {name: samples.filter(pl.col("user_id").is_in(ids.tolist())) for name, ids in parts.items()}
