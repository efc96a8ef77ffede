"""CTR samples from rating histories, and the seeded train/validation/test split by user.

One sample per interaction in the NEW part of a user's history: the label is ``rating >= threshold``;
the features are the target item and the user's ``history_len`` interactions just before it (old
and new history together, in timestamp order) with their ratings.

Implicit feedback (interactions with a ``weight`` column, rating null): a new interaction is labelled 1
when its weight is > 0 (or >= ``min_positive_weight``), and each positive gets ``negatives`` samples
labelled 0: the same user and history with an item the user never interacted with, drawn (seeded, with
replacement) from the interacted items in proportion to how many users touched each, so item
popularity alone does not separate the classes. ``hist_ratings`` then holds the history's weights.
"""

from __future__ import annotations

import logging

import numpy as np
import polars as pl

from pipelines.data.schema import is_implicit

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("user_id", "item_id", "label", "hist_items", "hist_ratings")
DRAW_ROUNDS = 8  # rejection rounds for negatives that hit an item the user touched; then an exact draw


def build_samples(
    old_interactions: pl.DataFrame,
    new_interactions: pl.DataFrame,
    rating_threshold: float = 4.0,
    history_len: int = 5,
    *,
    negatives: int = 4,
    seed: int = 0,
    min_positive_weight: float | None = None,
    seen: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Return samples: user_id, item_id, label (Int8), hist_items (List[Utf8]), hist_ratings (List[Float64]).

    History lists are oldest-first and hold at most ``history_len`` entries (fewer at the start of a
    history). Ties in timestamp keep the input order. Implicit feedback (module docstring) uses
    ``negatives``, ``seed``, ``min_positive_weight`` and ``seen`` (every interaction, for the items a user
    never interacted with and their popularity; default old and new together); explicit ignores them.
    """
    implicit = is_implicit(new_interactions)
    value = "weight" if implicit else "rating"
    samples = _with_history(old_interactions, new_interactions, value, history_len)
    if not implicit:
        return samples.select(
            pl.col("user_id").cast(pl.Utf8),
            pl.col("item_id").cast(pl.Utf8),
            (pl.col("rating") >= rating_threshold).cast(pl.Int8).alias("label"),
            "hist_items",
            "hist_ratings",
        )
    positive = pl.col("weight") > 0 if min_positive_weight is None else pl.col("weight") >= min_positive_weight
    observed = samples.select(
        pl.col("user_id").cast(pl.Utf8),
        pl.col("item_id").cast(pl.Utf8),
        positive.fill_null(False).cast(pl.Int8).alias("label"),
        "hist_items",
        "hist_ratings",
    )
    every = pl.concat([old_interactions, new_interactions], how="diagonal_relaxed") if seen is None else seen
    return _add_negatives(observed, every, negatives, seed)


def _with_history(old: pl.DataFrame, new: pl.DataFrame, value: str, history_len: int) -> pl.DataFrame:
    """The new interactions with ``hist_items`` and ``hist_ratings`` (``value``'s history) added."""
    cols = ["user_id", "item_id", value, "timestamp"]
    for name, frame in (("old_interactions", old), ("new_interactions", new)):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} lacks column(s) {missing}; has {frame.columns}")
    both = pl.concat(
        [
            old.select(cols).with_columns(pl.lit(False).alias("is_new")),
            new.select(cols).with_columns(pl.lit(True).alias("is_new")),
        ],
        how="vertical_relaxed",
    )
    both = both.with_row_index("_order").sort(["user_id", "timestamp", "_order"])
    lag_items = [pl.col("item_id").shift(k).over("user_id") for k in range(history_len, 0, -1)]
    lag_values = [pl.col(value).shift(k).over("user_id") for k in range(history_len, 0, -1)]
    return both.with_columns(
        pl.concat_list(lag_items).list.drop_nulls().alias("hist_items"),
        pl.concat_list(lag_values).list.drop_nulls().alias("hist_ratings"),
    ).filter(pl.col("is_new"))


def _add_negatives(observed: pl.DataFrame, seen: pl.DataFrame, negatives: int, seed: int) -> pl.DataFrame:
    """``observed`` with, after each positive, up to ``negatives`` label-0 copies holding a drawn item."""
    if negatives < 0:
        raise ValueError(f"negatives must be >= 0, got {negatives}")
    observed = observed.with_row_index("_src")
    positives = observed.filter(pl.col("label") == 1)
    drawn = _draw_negatives(positives.select("_src", "user_id"), seen, negatives, seed)
    fakes = drawn.join(positives.drop("item_id"), on="_src", how="inner").with_columns(
        pl.lit(0, pl.Int8).alias("label")
    )
    rows = pl.concat([observed.with_columns(pl.lit(-1, pl.Int64).alias("_slot")), fakes], how="diagonal_relaxed")
    return rows.sort(["_src", "_slot"]).select(SAMPLE_COLUMNS)


def _draw_negatives(slots_of: pl.DataFrame, seen: pl.DataFrame, negatives: int, seed: int) -> pl.DataFrame:
    """``_src, _slot, item_id`` rows: per ``_src`` row of ``slots_of``, ``negatives`` items its user never
    interacted with, drawn in proportion to how many users of ``seen`` touched each; seeded.

    Rejection rounds first (memory linear in the slots); slots still unfilled are drawn exactly from
    their users' untouched items (memory: those few users x the catalogue); a user who touched every
    item gets none."""
    pairs = seen.select(pl.col("user_id").cast(pl.Utf8), pl.col("item_id").cast(pl.Utf8)).unique()
    popularity = pairs.group_by("item_id").agg(pl.len().cast(pl.Float64).alias("_w")).sort("item_id")
    want = slots_of.join(pl.DataFrame({"_slot": np.arange(negatives, dtype=np.int64)}), how="cross")
    rng = np.random.default_rng(seed)
    found = [pl.DataFrame(schema={"_src": pl.UInt32, "_slot": pl.Int64, "item_id": pl.Utf8})]
    items, p = popularity["item_id"].to_numpy(), popularity["_w"].to_numpy()
    for _ in range(DRAW_ROUNDS if want.height and len(items) else 0):
        want = want.sort(["_src", "_slot"])
        draws = want.with_columns(pl.Series("item_id", items[rng.choice(len(items), want.height, p=p / p.sum())]))
        fresh = draws.join(pairs, on=["user_id", "item_id"], how="anti")
        found.append(fresh.select("_src", "_slot", "item_id"))
        want = want.join(fresh, on=["_src", "_slot"], how="anti")
        if want.height == 0:
            break
    if want.height:
        exact, want = _draw_untouched(want.sort(["_src", "_slot"]), pairs, popularity, rng)
        found.append(exact)
    if want.height:
        log.warning(
            "%d negative sample(s) dropped: %d user(s) touched every item", want.height, want["user_id"].n_unique()
        )
    return pl.concat(found, how="vertical_relaxed")


def _draw_untouched(
    want: pl.DataFrame, pairs: pl.DataFrame, popularity: pl.DataFrame, rng: np.random.Generator
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(drawn ``_src, _slot, item_id``, slots left): each slot of ``want`` gets one of its user's untouched
    items by popularity, through one cumulative sum over every (user, untouched item)."""
    untouched = (
        want.select("user_id")
        .unique()
        .join(popularity, how="cross")
        .join(pairs, on=["user_id", "item_id"], how="anti")
        .sort(["user_id", "item_id"])
        .with_row_index("_row")
        .with_columns(pl.col("_w").cum_sum().alias("_cum"))
    )
    bounds = untouched.group_by("user_id").agg(
        (pl.col("_cum").last() - pl.col("_w").sum()).alias("_lo"),
        pl.col("_w").sum().alias("_mass"),
        pl.col("_row").first().alias("_first"),
        pl.col("_row").last().alias("_last"),
    )
    slots = want.join(bounds, on="user_id", how="left", maintain_order="left")
    left = slots.filter(pl.col("_mass").is_null()).select(want.columns)
    slots = slots.filter(pl.col("_mass").is_not_null())
    target = slots["_lo"].to_numpy() + rng.random(slots.height) * slots["_mass"].to_numpy()
    rows = np.searchsorted(untouched["_cum"].to_numpy(), target, side="right")
    rows = np.clip(rows, slots["_first"].to_numpy(), slots["_last"].to_numpy())  # rounding at a user's edges
    drawn = slots.select("_src", "_slot").with_columns(untouched["item_id"].gather(rows).alias("item_id"))
    return drawn, left


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
