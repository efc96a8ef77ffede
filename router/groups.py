"""Grouping entities for retrieval pools: collaborative groups (K-means on embeddings) and attribute groups.

Both return a polars frame ``(entity_id: Utf8, group_id: Utf8)`` with every input entity exactly once,
deterministic for a seed.

Attribute rules (documented contract):
- Multi-valued attributes (a list column such as ``genres``) use their **first listed value**.
- A missing value (null, empty list, empty string) becomes ``missing_value`` ("unknown"); entities
  missing the first attribute therefore land in the fallback group ``"unknown"``.
- Numeric attributes named in ``bucket_widths`` are bucketed: ``year`` 1994 with width 10 -> "1990-1999".
- A group larger than ``max_group_size`` is split by the next attribute of the hierarchy (or, with
  ``split_target``, by the remaining attribute a decision tree finds most predictive of that target).
  When attributes run out, a still-too-large group is cut into equal seeded random parts ``#0, #1, ...``.
- Group ids join the values along the path with ``|``: "Drama|1990-1999".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from polars.datatypes import DataTypeClass
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.preprocessing import OneHotEncoder
from sklearn.tree import DecisionTreeClassifier

from router.embeddings import Embeddings

log = logging.getLogger(__name__)

GROUP_SCHEMA = pl.Schema({"entity_id": pl.Utf8, "group_id": pl.Utf8})


def collaborative_groups(
    embeddings: Embeddings,
    n_clusters: int | None = None,
    target_group_size: int | None = None,
    seed: int = 0,
    minibatch_above: int = 50_000,
) -> pl.DataFrame:
    """K-means over ``embeddings``; ``group_id`` is the cluster number as a string.

    ``n_clusters`` groups (the paper uses 3-10), or ceil(n / ``target_group_size``) for a target size; given
    both, the larger: groups multiply as the catalogue grows past ``n_clusters`` groups of that size.
    Above ``minibatch_above`` entities MiniBatchKMeans is used. Seeded.
    """
    n = len(embeddings)
    if n == 0:
        raise ValueError("no embeddings to cluster")
    if n_clusters is None and target_group_size is None:
        raise ValueError("give n_clusters, target_group_size or both")
    by_size = math.ceil(n / target_group_size) if target_group_size is not None else 0
    n_clusters = max(n_clusters or 0, by_size)
    if not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in 1..{n} (number of entities), got {n_clusters}")
    if n > minibatch_above:
        model = MiniBatchKMeans(n_clusters, random_state=seed, n_init=3, batch_size=4096)
    else:
        model = KMeans(n_clusters, random_state=seed, n_init=10)
    labels = model.fit_predict(embeddings.vectors)
    log.info("K-means: %d entities into %d groups", n, n_clusters)
    return pl.DataFrame({"entity_id": embeddings.ids, "group_id": [str(x) for x in labels]}, schema=GROUP_SCHEMA)


@dataclass
class AttributeGrouping:
    """How to group by attributes; see the module docstring for the rules."""

    hierarchy: Sequence[str]  # e.g. ("genres", "year") or ("category", "sub_category")
    max_group_size: int = 1000
    bucket_widths: dict[str, float] = field(default_factory=dict)  # e.g. {"year": 10, "age": 10}
    split_target: str | None = None  # column a decision tree predicts to choose the split attribute
    missing_value: str = "unknown"
    seed: int = 0


def _attribute_values(table: pl.DataFrame, column: str, config: AttributeGrouping) -> pl.Expr:
    """One string per entity for ``column`` (first value of lists, buckets for numbers, missing -> fallback)."""
    dtype: pl.DataType | DataTypeClass = table.schema[column]
    expr = pl.col(column)
    if isinstance(dtype, (pl.List, pl.Array)):
        expr = expr.list.first() if isinstance(dtype, pl.List) else expr.arr.first()
        dtype = dtype.inner
    if column in config.bucket_widths:
        if not dtype.is_numeric():
            raise ValueError(f"bucket width given for column {column!r}, which is not numeric ({dtype})")
        width = config.bucket_widths[column]
        low = (expr.cast(pl.Float64) / width).floor() * width
        expr = pl.format("{}-{}", low.cast(pl.Int64), (low + width - 1).cast(pl.Int64))
    expr = expr.cast(pl.Utf8).str.strip_chars()
    return pl.when(expr.is_null() | (expr == "")).then(pl.lit(config.missing_value)).otherwise(expr).alias(column)


def _tree_choice(frame: pl.DataFrame, candidates: list[str], target: str, seed: int) -> str:
    """The candidate attribute a depth-3 decision tree relies on most to predict ``target``."""
    known = frame.filter(pl.col(target).is_not_null())
    if known[target].n_unique() < 2:
        return candidates[0]
    encoder = OneHotEncoder(handle_unknown="ignore")
    features = encoder.fit_transform(known.select(candidates).to_numpy())
    tree = DecisionTreeClassifier(max_depth=3, random_state=seed).fit(features, known[target].cast(pl.Utf8).to_numpy())
    owners = np.repeat(np.arange(len(candidates)), [len(c) for c in encoder.categories_])
    importance = np.bincount(owners, weights=tree.feature_importances_, minlength=len(candidates))
    return candidates[int(np.argmax(importance))]  # argmax: ties go to hierarchy order


def _split(
    frame: pl.DataFrame,
    path: str,
    remaining: list[str],
    config: AttributeGrouping,
    rng: np.random.Generator,
    out: list[pl.DataFrame],
) -> None:
    if len(frame) <= config.max_group_size:
        out.append(frame.select("entity_id", group_id=pl.lit(path)))
        return
    if not remaining:
        parts = math.ceil(len(frame) / config.max_group_size)
        labels = rng.permutation(len(frame)) % parts
        out.append(frame.select("entity_id", group_id=pl.format("{}#{}", pl.lit(path), pl.Series(labels))))
        return
    column = remaining[0]
    if config.split_target is not None:
        column = _tree_choice(frame, remaining, config.split_target, config.seed)
    rest = [c for c in remaining if c != column]
    for (value,), sub in sorted(frame.partition_by(column, as_dict=True).items()):
        _split(sub, f"{path}|{value}", rest, config, rng, out)


def attribute_groups(table: pl.DataFrame, config: AttributeGrouping, id_column: str) -> pl.DataFrame:
    """Group the entities of ``table`` (one row per entity) by the attribute hierarchy of ``config``."""
    if config.max_group_size < 1:
        raise ValueError(f"max_group_size must be >= 1, got {config.max_group_size}")
    needed = [id_column, *config.hierarchy] + ([config.split_target] if config.split_target else [])
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"attribute table has no column(s) {missing} (columns: {table.columns})")
    if not config.hierarchy:
        raise ValueError("attribute hierarchy is empty")
    ids = table[id_column].cast(pl.Utf8)
    dupes = ids.filter(ids.is_duplicated()).unique().sort().to_list()
    if dupes:
        raise ValueError(f"attribute table has duplicate {id_column}s: {dupes[:5]}")
    frame = table.select(
        pl.col(id_column).cast(pl.Utf8).alias("entity_id"),
        *[_attribute_values(table, c, config) for c in config.hierarchy],
        *([pl.col(config.split_target)] if config.split_target else []),
    )
    first, rest = config.hierarchy[0], list(config.hierarchy[1:])
    out: list[pl.DataFrame] = []
    rng = np.random.default_rng(config.seed)
    for (value,), sub in sorted(frame.partition_by(first, as_dict=True).items()):
        _split(sub, str(value), rest, config, rng, out)
    groups = pl.concat(out) if out else pl.DataFrame(schema=GROUP_SCHEMA)
    log.info("attribute groups: %d entities into %d groups", len(groups), groups["group_id"].n_unique())
    return groups.cast(GROUP_SCHEMA)
