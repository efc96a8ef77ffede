"""Index spaces and tensors for the CTR models: item catalog, knowledge vectors, sample tensors.

Index 0 is padding/unknown everywhere (item ids, categories, genres).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import polars as pl
import torch

from pipelines.ops.features.encoding import read_vectors

log = logging.getLogger(__name__)


@dataclass
class ItemCatalog:
    """Item id -> index, plus each item's category index and up to ``max_genres`` genre indices."""

    index: dict[str, int]
    category: torch.Tensor  # [n_items + 1] long
    genres: torch.Tensor  # [n_items + 1, max_genres] long, 0 = no genre
    n_categories: int  # including index 0
    n_genres: int  # including index 0

    @property
    def n_items(self) -> int:
        return len(self.index) + 1

    @classmethod
    def build(cls, items: pl.DataFrame, extra_item_ids: Sequence[str] = (), max_genres: int = 3) -> "ItemCatalog":
        """Catalog over ``items`` (item_id, optional category, optional genres) plus ids seen only in interactions."""
        cols = [pl.col("item_id").cast(pl.Utf8)]
        cols.append(
            pl.col("category").cast(pl.Utf8) if "category" in items.columns else pl.lit(None, pl.Utf8).alias("category")
        )
        cols.append(
            pl.col("genres").cast(pl.List(pl.Utf8))
            if "genres" in items.columns
            else pl.lit(None, pl.List(pl.Utf8)).alias("genres")
        )
        table = items.select(cols).unique(subset="item_id", keep="first", maintain_order=True)
        extra = sorted(set(extra_item_ids) - set(table["item_id"].to_list()))
        if extra:
            table = pl.concat([table, pl.DataFrame({"item_id": extra}, schema={"item_id": pl.Utf8})], how="diagonal")
        cats = {c: i + 1 for i, c in enumerate(sorted(table["category"].drop_nulls().unique().to_list()))}
        all_genres = sorted({g for gs in table["genres"].to_list() if gs for g in gs if g is not None})
        genre_idx = {g: i + 1 for i, g in enumerate(all_genres)}
        category = torch.zeros(table.height + 1, dtype=torch.long)
        genres = torch.zeros(table.height + 1, max_genres, dtype=torch.long)
        for row, (cat, gs) in enumerate(zip(table["category"].to_list(), table["genres"].to_list()), start=1):
            category[row] = cats.get(cat, 0)
            picked = [genre_idx[g] for g in (gs or []) if g is not None][:max_genres]
            genres[row, : len(picked)] = torch.tensor(picked, dtype=torch.long)
        index = {item: i + 1 for i, item in enumerate(table["item_id"].to_list())}
        return cls(index, category, genres, len(cats) + 1, len(genre_idx) + 1)

    def lookup(self, ids: list[str]) -> torch.Tensor:
        """Indices of item ids (0 for unknown ids)."""
        return torch.tensor([self.index.get(i, 0) for i in ids], dtype=torch.long)


@dataclass
class KnowledgeVectors:
    """User and item knowledge vectors by id (from a vectors Parquet); missing entities get zeros + flag 0."""

    user: dict[str, np.ndarray]
    item: dict[str, np.ndarray]
    dim: int

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> "KnowledgeVectors":
        """From a frame with entity_type, entity_id, vector (fixed-size or list float column)."""
        if frame.height == 0:
            raise ValueError("knowledge vectors frame is empty")
        matrix = np.asarray(frame["vector"].to_list(), dtype=np.float32)
        by_type: dict[str, dict[str, np.ndarray]] = {"user": {}, "item": {}}
        for kind, eid, vec in zip(frame["entity_type"].to_list(), frame["entity_id"].to_list(), matrix):
            if kind not in by_type:
                raise ValueError(
                    f"knowledge vectors: entity_type must be 'user' or 'item', got {kind!r} for id {eid!r}"
                )
            by_type[kind][str(eid)] = vec
        return cls(by_type["user"], by_type["item"], matrix.shape[1])

    @classmethod
    def from_parquet(cls, path: str | Path) -> "KnowledgeVectors":
        """Read a vectors Parquet written by :func:`pipelines.ops.features.encoding.encode_knowledge`."""
        return cls.from_frame(read_vectors(path))

    def lookup(self, kind: str, ids: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Vectors ``[N, dim]`` (zeros where missing) and presence flags ``[N]`` for user or item ids."""
        table = self.user if kind == "user" else self.item
        zeros = np.zeros(self.dim, dtype=np.float32)
        has = np.array([i in table for i in ids], dtype=np.float32)
        vecs = np.stack([table.get(i, zeros) for i in ids]) if ids else np.zeros((0, self.dim), np.float32)
        if len(ids) and has.mean() < 1.0:
            log.debug("%s knowledge missing for %d of %d samples", kind, int(len(ids) - has.sum()), len(ids))
        return torch.from_numpy(vecs), torch.from_numpy(has)


@dataclass
class CtrTensors:
    """A set of CTR samples as tensors. ``user_vec`` and friends are None when no knowledge is used."""

    user_ids: np.ndarray  # [N] object, kept to trace which users a computation saw
    target: torch.Tensor  # [N] long item index
    hist: torch.Tensor  # [N, H] long item index, 0 = padding (oldest first, right-aligned)
    hist_rating: torch.Tensor  # [N, H] float rating, 0 at padding
    label: torch.Tensor  # [N] float 0/1
    user_vec: torch.Tensor | None = None  # [N, D]
    user_has: torch.Tensor | None = None  # [N]
    item_vec: torch.Tensor | None = None  # [N, D]
    item_has: torch.Tensor | None = None  # [N]

    def __len__(self) -> int:
        return len(self.label)

    def take(self, idx: torch.Tensor) -> "CtrTensors":
        """The samples at ``idx`` (a long tensor)."""
        picked: dict[str, Any] = {
            f.name: (
                None
                if getattr(self, f.name) is None
                else getattr(self, f.name)[idx.numpy() if f.name == "user_ids" else idx]
            )
            for f in fields(self)
        }
        return replace(self, **picked)

    def batches(self, batch_size: int, generator: torch.Generator | None = None) -> Iterator["CtrTensors"]:
        """Mini-batches; shuffled with ``generator`` when given, in order otherwise."""
        order = torch.randperm(len(self), generator=generator) if generator is not None else torch.arange(len(self))
        for start in range(0, len(self), batch_size):
            yield self.take(order[start : start + batch_size])


def to_tensors(
    samples: pl.DataFrame, catalog: ItemCatalog, knowledge: KnowledgeVectors | None = None, history_len: int = 5
) -> CtrTensors:
    """Turn samples from :func:`pipelines.ctr.samples.build_samples` into tensors (history right-aligned)."""
    n = samples.height
    hist = torch.zeros(n, history_len, dtype=torch.long)
    hist_rating = torch.zeros(n, history_len, dtype=torch.float32)
    for row, (items, ratings) in enumerate(zip(samples["hist_items"].to_list(), samples["hist_ratings"].to_list())):
        items, ratings = items[-history_len:], ratings[-history_len:]
        if items:
            hist[row, history_len - len(items) :] = catalog.lookup(items)
            hist_rating[row, history_len - len(items) :] = torch.tensor(ratings, dtype=torch.float32)
    users = samples["user_id"].to_list()
    items = samples["item_id"].to_list()
    data = CtrTensors(
        np.array(users, dtype=object),
        catalog.lookup(items),
        hist,
        hist_rating,
        torch.tensor(samples["label"].to_numpy(), dtype=torch.float32),
    )
    if knowledge is not None:
        data.user_vec, data.user_has = knowledge.lookup("user", users)
        data.item_vec, data.item_has = knowledge.lookup("item", items)
    return data
