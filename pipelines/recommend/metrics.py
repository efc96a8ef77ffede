"""Top-K evaluation against held-out items: recall@K and NDCG@K (binary relevance), as in AtSpeed."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import polars as pl


def user_metrics(ranked: Sequence[str], held_out: set[str], k: int) -> tuple[float, float]:
    """(recall@k, NDCG@k) of one ranked list against the user's held-out items."""
    if not held_out:
        raise ValueError("a user without held-out items cannot be evaluated")
    top = list(ranked)[:k]
    hits = [r for r, item in enumerate(top, 1) if item in held_out]
    dcg = sum(1.0 / math.log2(r + 1) for r in hits)
    idcg = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(held_out), k) + 1))
    return len(hits) / len(held_out), dcg / idcg


def evaluate(recs: pl.DataFrame, held_out: Mapping[str, set[str]], ks: Sequence[int]) -> dict[str, float]:
    """Mean recall@k and NDCG@k over the users of ``recs`` (``user_id, rank, item_id``) for each k."""
    lists = {u: g.sort("rank")["item_id"].to_list() for (u,), g in recs.group_by(["user_id"])}
    users = sorted(u for u in lists if held_out.get(u))
    out: dict[str, float] = {"users": float(len(users))}
    for k in ks:
        pairs = [user_metrics(lists[u], held_out[u], k) for u in users]
        out[f"recall@{k}"] = sum(p[0] for p in pairs) / len(pairs) if pairs else 0.0
        out[f"ndcg@{k}"] = sum(p[1] for p in pairs) / len(pairs) if pairs else 0.0
    return out
