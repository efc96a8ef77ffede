"""`laser encode`: the latest view's knowledge -> sentence vectors -> one feature table per entity type.

Files under ``<output>/features/`` (each written atomically):
``latest.vectors.parquet`` (the encoder's cache, see :mod:`pipelines.ops.features.encoding`), and
``user_knowledge.parquet`` / ``item_knowledge.parquet`` with the join key (``user_id`` / ``item_id``),
``event_timestamp`` (= ``generated_at``), ``knowledge``, ``knowledge_vector`` (list<float32>),
``source_hash`` and ``run_id``: what the Feast file sources read.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.ops.schedule.latest import LATEST_FILE, read_latest
from pipelines.storage import atomic_write_local

log = logging.getLogger(__name__)

ENTITY_TYPES = ("user", "item")
FEATURE_COLUMNS = ("knowledge", "knowledge_vector", "source_hash", "run_id")


@dataclass(frozen=True)
class FeatureTables:
    """Where the encoded feature tables are, and the vector dimension."""

    root: Path
    dim: int

    def table(self, entity_type: str) -> Path:
        return self.root / f"{entity_type}_knowledge.parquet"


def features_dir(output: str | Path) -> Path:
    return Path(output) / "features"


def encode_latest(output: str | Path, encoder: str = "all-minilm-l6-v2", batch_size: int = 32) -> FeatureTables:
    """Encode ``<output>/latest.parquet`` (only texts not encoded before) and write the feature tables, under
    the output's run lock."""
    from pipelines.lock import output_lock

    if not Path(output).is_dir():
        raise FileNotFoundError(f"{output}: no job output here; run `laser run CONFIG` first")
    with output_lock(output, run_id="encode"):
        return _encode_latest(output, encoder, batch_size)


def _encode_latest(output: str | Path, encoder: str, batch_size: int) -> FeatureTables:
    from pipelines.ops.features.encoding import encode_knowledge

    out = features_dir(output)
    out.mkdir(parents=True, exist_ok=True)
    latest_path = Path(output) / LATEST_FILE
    latest = read_latest(latest_path)
    vectors_path = encode_knowledge(latest_path, encoder, out_path=out / "latest.vectors.parquet",
                                    batch_size=batch_size, progress=False)
    vectors = pl.read_parquet(vectors_path).select("entity_type", "entity_id", "vector")
    joined = latest.join(vectors, on=["entity_type", "entity_id"], how="inner")
    dropped = latest.height - joined.height
    if dropped:
        log.warning("%s: %d entities without a vector (empty knowledge) are left out of the features", latest_path,
                    dropped)
    dim = vectors.schema["vector"].size
    for etype in ENTITY_TYPES:
        _write_table(joined.filter(pl.col("entity_type") == etype), etype, out / f"{etype}_knowledge.parquet")
    return FeatureTables(out, dim)


def _write_table(frame: pl.DataFrame, entity_type: str, path: Path) -> None:
    table = frame.select(
        pl.col("entity_id").alias(f"{entity_type}_id"),
        pl.col("generated_at").alias("event_timestamp"),
        "knowledge",
        pl.col("vector").arr.to_list().cast(pl.List(pl.Float32)).alias("knowledge_vector"),
        "source_hash", "run_id",
    ).to_arrow()
    atomic_write_local(Path(path), lambda tmp: pq.write_table(table, tmp))
    log.info("features: %d %ss -> %s", table.num_rows, entity_type, path)


def read_feature_table(path: str | Path) -> pa.Table:
    return pq.read_table(path)
