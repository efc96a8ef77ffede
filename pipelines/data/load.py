"""`load_dataset`: one entry point from a `DatasetConfig` to canonical tables, with seeded trial limits."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from pipelines.data.config import DatasetConfig
from pipelines.data.readers import DataFileError
from pipelines.data.schema import Dataset, is_implicit
from pipelines.store.location import is_uri

log = logging.getLogger(__name__)


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the configured dataset in canonical form, then apply ``limit_users``/``limit_items``.

    Bad rows are skipped one at a time and counted in ``Dataset.notes``; a file that cannot be read, or
    nothing usable left, raises :class:`DataFileError` with one line naming the file (and column)."""
    ds = check_interactions(as_feedback(_load_checked(cfg), cfg.feedback), cfg.rating_scale)
    if ds.interactions.is_empty():
        raise DataFileError(
            f"dataset.path {cfg.path!r} (format {cfg.format}): no usable interactions left"
            + (f"; skipped: {'; '.join(ds.notes)}" if ds.notes else "")
        )
    if cfg.name:
        ds.name = cfg.name
    ds.domain = cfg.resolved_domain()
    ds = limit_dataset(ds, cfg.limit_users, cfg.limit_items, cfg.seed, cfg.sample_items)
    log.info(
        "dataset %s: %d users, %d items, %d interactions",
        ds.name,
        ds.users.height,
        ds.items.height,
        ds.interactions.height,
    )
    return ds


SHOWN_ROWS = 5


def as_feedback(ds: Dataset, feedback: str) -> Dataset:
    """``ds`` as ``feedback`` says: implicit interactions from a loader that reads ratings (MovieLens, Amazon,
    synthetic) drop them and weigh 1 each, with no event (pipelines/data/schema.py)."""
    if feedback == "explicit" or is_implicit(ds.interactions):
        return ds
    inter = ds.interactions.with_columns(
        rating=pl.lit(None, pl.Float64), weight=pl.lit(1.0, pl.Float64), event=pl.lit(None, pl.Utf8)
    )
    return Dataset(name=ds.name, domain=ds.domain, interactions=inter, items=ds.items, users=ds.users, notes=ds.notes)


def check_interactions(ds: Dataset, scale: tuple[float, float] | None = None) -> Dataset:
    """Documented rules on every loader's interactions, each counted in ``ds.notes`` with its first rows:
    ratings that are NaN, infinite, negative or outside ``scale`` are skipped; of several rows for one
    (user, item) the newest is kept (equal timestamps: the later row in the file). Implicit feedback: weights
    that are NaN, infinite or negative are skipped; several rows for one (user, item) merge into one
    (:func:`merge_repeats`)."""
    inter, notes = ds.interactions, dict(ds.notes)
    implicit = is_implicit(inter)
    value = pl.col("weight" if implicit else "rating")
    bad = value.is_nan() | value.is_infinite() | (value < 0)
    if scale is not None and not implicit:
        bad = bad | (value < scale[0]) | (value > scale[1])
    invalid = inter.filter(bad)
    what = "NaN, infinite or negative" + (
        f", or outside dataset.rating_scale [{scale[0]}, {scale[1]}]" if scale and not implicit else ""
    )
    _note_rows(notes, ds.name, f"interactions with invalid {value.meta.output_name()}s ({what}), skipped", invalid)
    inter = inter.filter(~bad)
    if implicit:
        return Dataset(
            name=ds.name,
            domain=ds.domain,
            interactions=merge_repeats(inter, ds.name, notes),
            items=ds.items,
            users=ds.users,
            notes=notes,
        )
    newest = inter.unique(subset=["user_id", "item_id"], keep="last", maintain_order=True)  # sorted by time
    if newest.height < inter.height:
        superseded = inter.join(newest, on=list(inter.columns), how="anti", nulls_equal=True)
        _note_rows(
            notes,
            ds.name,
            "duplicate (user, item) interactions: the newest kept (equal timestamps: the "
            "later row), older rows skipped",
            superseded,
        )
        inter = newest
    return Dataset(name=ds.name, domain=ds.domain, interactions=inter, items=ds.items, users=ds.users, notes=notes)


def merge_repeats(inter: pl.DataFrame, source: str, notes: dict) -> pl.DataFrame:
    """Implicit interactions with one row per (user, item): several rows (a view, then a purchase; three
    plays) merge into one at the newest time, weights summed, with the event of the heaviest row (ties: the
    newest); the merged rows are counted in ``notes``."""
    keys = ["user_id", "item_id"]
    repeated = inter.filter(pl.len().over(keys) > 1)
    if repeated.is_empty():
        return inter
    _note_rows(
        notes,
        source,
        "repeated (user, item) interactions merged into one: weights summed, newest time, the heaviest row's event",
        repeated,
    )
    heaviest = inter.sort(["weight", "timestamp"]).group_by(keys).agg(pl.col("event").last())
    merged = (
        inter.group_by(keys)
        .agg(pl.col("rating").first(), pl.col("timestamp").max(), pl.col("weight").sum())
        .join(heaviest, on=keys)
    )
    return merged.select(inter.columns).sort(["user_id", "timestamp", "item_id"])


def _note_rows(notes: dict, source: str, what: str, rows: pl.DataFrame) -> None:
    if rows.is_empty():
        return
    value = "weight" if is_implicit(rows) else "rating"
    shown = [
        f"user {u} item {i} {value} {r} time {t}"
        for u, i, r, t in rows.select("user_id", "item_id", value, "timestamp").head(SHOWN_ROWS).iter_rows()
    ]
    notes[what] = {"count": rows.height, "first": shown}
    log.warning("%s: %s: %d row(s), first: %s", source, what, rows.height, "; ".join(shown))


def _load_checked(cfg: DatasetConfig) -> Dataset:
    """``_load_full``, with a table error the rules above do not cover turned into one line naming the input."""
    try:
        return _load_full(cfg)
    except pl.exceptions.PolarsError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataFileError(f"dataset.path {cfg.path!r} (format {cfg.format}): unreadable input ({first})") from err


def _load_full(cfg: DatasetConfig) -> Dataset:
    if cfg.format == "synthetic":
        from pipelines.data.synthetic import synthetic_dataset

        return synthetic_dataset(cfg.synthetic, seed=cfg.seed)
    if cfg.format == "table":  # a file, folder, glob or URI (pipelines/data/table_files.py)
        from pipelines.data.table import load_table

        return load_table(cfg.path or "", cfg)
    if is_uri(cfg.path):
        raise DataFileError(
            f"dataset.path {cfg.path!r}: format {cfg.format} reads a local folder; data behind a URI is read "
            "by format: table"
        )
    path = Path(cfg.path or "")
    if not path.exists():
        raise FileNotFoundError(f"dataset.path {str(path)!r} (format {cfg.format}) does not exist")
    if cfg.format == "movielens":
        from pipelines.data.movielens import load_movielens

        return load_movielens(path)
    if cfg.format == "amazon":
        from pipelines.data.amazon import load_amazon

        return load_amazon(path, reviews_file=cfg.reviews_file, metadata_file=cfg.metadata_file)
    raise ValueError(f"dataset.format {cfg.format!r}: unknown")


SAMPLE_RULES = ("most_rated", "whole_histories")


def limit_dataset(
    ds: Dataset, limit_users: int | None, limit_items: int | None, seed: int = 0, sample_items: str = "most_rated"
) -> Dataset:
    """Seeded sample for trial runs that honours both limits; ``ds.notes["sample"]`` (also logged) says in
    one line what it kept and why.

    Users are drawn in one seeded order among those with interactions (the same order for every rule).

    - ``most_rated`` (default): the first ``limit_users`` users are kept; then at most ``limit_items``
      items, the ones those users rated most (ties by item id), and histories are cut to the kept items
      (:func:`_most_rated_items`: when the most-rated items would leave a kept user without any rating,
      the items that give every kept user one are taken first). A user is dropped only when
      ``limit_items`` is too small to give each kept user a rating; the notes and the log say how many.
    - ``whole_histories``: histories are never cut. Users are kept in the seeded order while the items
      they touched, with those of the users kept before them, stay within ``limit_items``; a user whose
      history would pass it is passed over (so fewer than ``limit_users`` users may be kept, and the log
      says how many were passed over). No user fitting at all is an error naming the smallest history.
    """
    if limit_users is None and limit_items is None:
        return ds
    if sample_items not in SAMPLE_RULES:
        raise ValueError(f"sample_items must be one of {list(SAMPLE_RULES)}, got {sample_items!r}")
    inter = ds.interactions
    order = user_order(inter, seed)
    if sample_items == "whole_histories":
        kept_users, kept_items, passed_over = _whole_histories(inter, order, limit_users, limit_items)
        small = inter.filter(pl.col("user_id").is_in(pl.Series(kept_users, dtype=pl.Utf8).implode()))
        before, covered = small, 0
    else:
        picked = order if limit_users is None else order[:limit_users]
        before = inter.filter(pl.col("user_id").is_in(pl.Series(picked, dtype=pl.Utf8).implode()))
        kept_items, covered = _most_rated_items(before, limit_items)
        small = before.filter(pl.col("item_id").is_in(pl.Series(kept_items, dtype=pl.Utf8).implode()))
        kept_users, passed_over = small["user_id"].unique().sort().to_list(), 0
    users_kept = pl.Series(kept_users, dtype=pl.Utf8).implode()
    items = ds.items.filter(pl.col("item_id").is_in(small["item_id"].unique().implode()))
    users = ds.users.filter(pl.col("user_id").is_in(users_kept))
    notes = dict(ds.notes)
    notes.update(sample_notes(ds, small, items, users, passed_over))
    asked_users = len(order) if limit_users is None else min(limit_users, len(order))
    if sample_items == "most_rated":
        notes["sample_dropped_interactions"] = before.height - small.height
        notes["sample_users_without_interactions"] = asked_users - len(kept_users)
    notes["sample"] = _summary(
        sample_items,
        seed,
        limit_users,
        limit_items,
        order,
        before,
        small,
        items,
        len(kept_users),
        passed_over,
        covered,
        inter.height,
    )
    log.info("%s", notes["sample"])
    return Dataset(name=ds.name, domain=ds.domain, interactions=small, items=items, users=users, notes=notes)


def user_order(inter: pl.DataFrame, seed: int) -> list[str]:
    """Users with interactions in the seeded order every sample rule draws them in."""
    ids = inter.select(pl.col("user_id").unique().sort())
    return ids.sample(fraction=1.0, shuffle=True, seed=seed)["user_id"].to_list()


def _whole_histories(
    inter: pl.DataFrame, order: list[str], limit_users: int | None, limit_items: int | None
) -> tuple[list[str], list[str], int]:
    """Users kept whole in ``order`` while their items stay within ``limit_items``; (users, items, passed over)."""
    per_user = dict(inter.group_by("user_id").agg(pl.col("item_id").unique()).iter_rows())
    kept_users: list[str] = []
    kept_items: set[str] = set()
    passed_over = 0
    for uid in order:
        if limit_users is not None and len(kept_users) >= limit_users:
            break
        union = kept_items | set(per_user[uid])
        if limit_items is not None and len(union) > limit_items:
            passed_over += 1
            continue
        kept_users.append(uid)
        kept_items = union
    if not kept_users:
        smallest = min(len(v) for v in per_user.values())
        raise ValueError(
            f"dataset.sample_items: whole_histories keeps no user: the smallest history has {smallest} "
            f"items, more than limit_items={limit_items}; raise limit_items or use sample_items: "
            "most_rated (cuts histories to the most-rated items)"
        )
    return kept_users, sorted(kept_items), passed_over


def _most_rated_items(inter: pl.DataFrame, limit: int | None) -> tuple[list[str], int]:
    """At most ``limit`` items of ``inter``: the most-rated (ties by item id) when they give every user of
    ``inter`` at least one rating; otherwise a greedy cover first (the item rated by the most users not yet
    covered, ties by rating count then id, until every user has one or ``limit`` items are taken), then the
    most-rated of the rest. Returns (items, how many of them are not among the ``limit`` most-rated)."""
    counts = inter.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])
    ranked = counts["item_id"].to_list()
    if limit is None or len(ranked) <= limit:
        return ranked, 0
    top = ranked[:limit]
    users = inter["user_id"].n_unique()
    covered = inter.filter(pl.col("item_id").is_in(pl.Series(top, dtype=pl.Utf8).implode()))["user_id"].n_unique()
    if covered == users:
        return top, 0
    popularity = counts.rename({"len": "ratings"})
    chosen: list[str] = []
    left = inter
    while left.height and len(chosen) < limit:
        best = (
            left.group_by("item_id")
            .agg(pl.col("user_id").n_unique().alias("users"))
            .join(popularity, on="item_id")
            .sort(["users", "ratings", "item_id"], descending=[True, True, False])
        )
        item = best["item_id"][0]
        chosen.append(item)
        now = left.filter(pl.col("item_id") == item)["user_id"].unique().implode()
        left = left.filter(~pl.col("user_id").is_in(now))
    taken = set(chosen)
    chosen += [i for i in ranked if i not in taken][: limit - len(chosen)]
    return chosen, len(set(chosen) - set(top))


def _summary(
    rule: str,
    seed: int,
    limit_users: int | None,
    limit_items: int | None,
    order: list[str],
    before: pl.DataFrame,
    small: pl.DataFrame,
    items: pl.DataFrame,
    n_users: int,
    passed_over: int,
    covered: int,
    total_interactions: int,
) -> str:
    """The one line that says what a trial sample kept and why."""
    asked_u = f"{limit_users} asked" if limit_users is not None else "no limit_users"
    asked_i = f"{limit_items} asked" if limit_items is not None else "no limit_items"
    head = (
        f"trial sample (sample_items={rule}, seed {seed}): users {n_users} kept of {asked_u} "
        f"({len(order)} with ratings)"
    )
    if rule == "whole_histories":
        why = (
            f"; {passed_over} passed over: their whole history would take the items past limit_items={limit_items}"
            if passed_over
            else ""
        )
        return (
            f"{head}{why}; items {items.height} kept of {asked_i}: every item the kept users rated (histories "
            f"are never cut); interactions {small.height} kept of {total_interactions}"
        )
    pool = before["item_id"].n_unique()
    if limit_items is None or pool <= limit_items:
        item_why = f"every item the kept users rated ({pool})"
    else:
        item_why = f"the most-rated of the {pool} items the kept users rated"
        if covered:
            item_why += f" ({covered} of them in place of more-rated ones, so that every kept user keeps a rating)"
    asked = len(order) if limit_users is None else min(limit_users, len(order))
    dropped = asked - n_users
    drop = (
        (
            f"; {dropped} drawn users dropped: none of their ratings is among the kept items (limit_items="
            f"{limit_items} is too few to give each of the {asked} users one)"
        )
        if dropped
        else ""
    )
    return (
        f"{head}; items {items.height} kept of {asked_i}: {item_why}; interactions {small.height} kept of the "
        f"kept users' {before.height} (histories cut to the kept items; {total_interactions} in the data){drop}"
    )


def _share(kept: int, total: int) -> str:
    return f"{kept} of {total} ({kept / total:.1%})" if total else f"{kept} of 0"


def sample_notes(
    full: Dataset, inter: pl.DataFrame, items: pl.DataFrame, users: pl.DataFrame, passed_over: int
) -> dict[str, str | int]:
    """How much of ``full`` a sample kept, for ``Dataset.notes`` (and so the job's closing summary)."""
    notes: dict[str, str | int] = {
        "sample_kept_users": _share(users.height, full.users.height),
        "sample_kept_items": _share(items.height, full.items.height),
        "sample_kept_interactions": _share(inter.height, full.interactions.height),
    }
    if passed_over:
        notes["sample_users_passed_over_for_limit_items"] = passed_over
    return notes
