"""The "latest" view: one row per entity, its newest knowledge; what CTR training and the feature store read.

Built from the knowledge store (every run's rows) and the old-knowledge store (entities that only have
old knowledge, e.g. existing items); the row of the newest run wins: ordered by ``run_seq`` (the driver's
run sequence, so no node's clock decides), then by ``generated_at`` (the driver's UTC clock; rows
written before ``run_seq`` existed have none and count as older than every row that has one). Written atomically as
``<output>/latest.parquet`` at the end of every scheduled run (``laser latest CONFIG`` rebuilds it).

The newest row per entity is chosen from the stores' index (no texts); then only those rows are read,
streamed shard by shard, so memory holds the index, one shard and the view.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import polars as pl
import pyarrow as pa

from pipelines.frames import as_frame
from pipelines.knowledge_store import POSITION, KnowledgeRow, iter_knowledge, read_index, row_spec
from pipelines.sharded_store import KEY_COLUMNS, parquet_bytes
from pipelines.lock import check_held
from pipelines.storage import Location

log = logging.getLogger(__name__)

LATEST_FILE = "latest.parquet"


def newest_per_entity(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per (entity_type, entity_id): the newest by (``run_seq``, ``generated_at``)."""
    return (
        frame.sort(["run_seq", "generated_at"], nulls_last=False, maintain_order=True)
        .unique(subset=list(KEY_COLUMNS), keep="last", maintain_order=True)
        .sort(list(KEY_COLUMNS))
    )


def latest_view(
    knowledge: str | Path | Location,
    old_knowledge: str | Path | Location | None = None,
    columns: Sequence[str] | None = None,
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> pl.DataFrame:
    """The newest row per entity over ``knowledge`` (and ``old_knowledge``), with a ``store`` column;
    ``columns`` only, with the key columns (every column of ``row_type``, the knowledge row, by default)."""
    stores = {"knowledge": knowledge} | ({"old_knowledge": old_knowledge} if old_knowledge is not None else {})
    index = pl.concat([read_index(where).with_columns(store=pl.lit(name)) for name, where in stores.items()])
    newest = newest_per_entity(index)
    schema = row_spec(row_type).schema
    names = schema.names if columns is None else [c for c in KEY_COLUMNS if c not in columns] + list(columns)
    frames = []
    for name, where in stores.items():
        rows = newest.filter(pl.col("store") == name)[POSITION].sort().to_list()
        batches = list(iter_knowledge(where, names, rows=rows, row_type=row_type))
        table = pa.Table.from_batches(batches, schema=pa.schema([schema.field(c) for c in names]))
        frames.append(as_frame(table).with_columns(store=pl.lit(name)))
    return pl.concat(frames).sort(list(KEY_COLUMNS))


def write_latest(path: str | Path | Location, view: pl.DataFrame) -> Location:
    """Write the view as one Parquet file, atomically (readers never see a partial file)."""
    check_held()
    out = Location.of(path)
    out.write_bytes(parquet_bytes(view.to_arrow()))
    log.info("latest view: %d entities -> %s", view.height, out)
    return out


def read_latest(path: str | Path | Location) -> pl.DataFrame:
    """The latest view a run wrote (``<output>/latest.parquet`` or that file's path)."""
    p = Location.of(path)
    p = p if p.name.endswith(".parquet") else p / LATEST_FILE
    if not p.exists():
        raise FileNotFoundError(f"{p}: no latest view; run `laser run CONFIG --incremental` or `laser latest CONFIG`")
    return pl.read_parquet(p.read_bytes())
