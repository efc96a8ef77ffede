"""Recommendation Parquet: one row per (user, rank), a sharded store
(atomic shards + manifest + failures.jsonl, see :mod:`pipelines.store.shards`). A user's K rows are always
written in one shard, so a resumed run skips exactly the users already written."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import polars as pl
import pyarrow as pa

from pipelines.store.frames import as_frame
from pipelines.store.shards import ShardedWriter, done_keys, read_shard, scan_store

log = logging.getLogger(__name__)

_FIELDS: list[pa.Field] = (  # typed: the stubs' Field is invariant, so a mixed list would be list[object]
    [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),  # 1 = best
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),  # log-probability of the item's identifier
        pa.field("decoder", pa.string(), nullable=False),
        pa.field("decoder_params", pa.string(), nullable=False),  # JSON object, keys sorted
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("generated_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # provenance and cost of the user's search (same value on each of its K rows)
        pa.field("model", pa.string()),
        pa.field("target_forwards", pa.int32()),
        pa.field("beam_steps", pa.int32()),
        pa.field("decode_s", pa.float64()),
    ]
)
RECOMMENDATION_SCHEMA = pa.schema(_FIELDS)
USER_KEY = ("user_id",)


class RecommendationWriter(ShardedWriter):
    """Writes recommendation rows; ``add_rows(one user's rows)`` keeps a user's ranks in one shard."""

    schema = RECOMMENDATION_SCHEMA
    key_columns = USER_KEY

    def row_key(self, row: Mapping[str, Any]) -> str:
        return f"user {row.get('user_id')!r} rank {row.get('rank')}"


def done_users(store: str | Path) -> set[str]:
    """Users with recommendations in ``store`` (a resumed run skips them)."""
    return {k[0] for k in done_keys(store, USER_KEY)}


def read_recommendations(store: str | Path) -> pl.DataFrame:
    """Every recommendation row in ``store``, sorted by user and rank."""
    root = Path(store)
    tables = [read_shard(root, s, schema=RECOMMENDATION_SCHEMA) for s in scan_store(root).shards]
    table = pa.concat_tables(tables) if tables else RECOMMENDATION_SCHEMA.empty_table()
    return as_frame(table).sort("user_id", "rank")
