"""`laser encode`: the latest view's knowledge -> sentence vectors -> one feature table per entity type.

Files under ``<output>/features/`` (each written atomically):
``latest.vectors.parquet`` (the encoder's cache, see :mod:`pipelines.ops.features.encoding`), and
``user_knowledge.parquet`` / ``item_knowledge.parquet`` with the join key (``user_id`` / ``item_id``),
``event_timestamp`` (= ``generated_at``), the knowledge row's feature columns (its fields marked ``feature``:
``knowledge``, ``run_id``, ``source_hash``; pipelines/store/knowledge.py) and ``knowledge_vector``
(list<float32>): what the Feast file sources read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.store.knowledge import KnowledgeRow, row_spec
from pipelines.ops.schedule.latest import LATEST_TABLE, read_latest
from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)

ENTITY_TYPES = ("user", "item")
VECTOR = "knowledge_vector"  # the text's sentence vector, a feature beside the row's own


@dataclass(frozen=True)
class FeatureTables:
    """Where the encoded feature tables are, the vector dimension and the row whose fields marked ``feature``
    they hold."""

    root: Path
    dim: int
    row_type: type[KnowledgeRow] = field(default=KnowledgeRow)

    @property
    def features(self) -> tuple[str, ...]:
        """The tables' feature columns: the row's feature fields, then the vector."""
        return (*row_spec(self.row_type).features, VECTOR)

    def table(self, entity_type: str) -> Path:
        return self.root / f"{entity_type}_knowledge.parquet"


def features_dir(output: str | Path) -> Path:
    return Path(output) / "features"


def encode_latest(
    output: str | Path,
    encoder: str = "all-minilm-l6-v2",
    batch_size: int = 32,
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> FeatureTables:
    """Encode the latest view ``<output>/latest/`` (only texts not encoded before) and write the feature tables (the
    feature fields of ``row_type``), under the output's run lock."""
    from pipelines.store.lock import output_lock

    if not Path(output).is_dir():
        raise FileNotFoundError(f"{output}: no job output here; run `laser run CONFIG` first")
    with output_lock(output, run_id="encode"):
        return _encode_latest(output, encoder, batch_size, row_type)


def _encode_latest(output: str | Path, encoder: str, batch_size: int, row_type: type[KnowledgeRow]) -> FeatureTables:
    from pipelines.ops.features.encoding import encode_knowledge

    out = features_dir(output)
    out.mkdir(parents=True, exist_ok=True)
    latest_path = Path(output) / LATEST_TABLE
    latest = read_latest(output)
    vectors_path = encode_knowledge(
        latest_path, encoder, out_path=out / "latest.vectors.parquet", batch_size=batch_size, progress=False
    )
    vectors = pl.read_parquet(vectors_path).select("entity_type", "entity_id", "vector")
    joined = latest.join(vectors, on=["entity_type", "entity_id"], how="inner")
    dropped = latest.height - joined.height
    if dropped:
        log.warning(
            "%s: %d entities without a vector (empty knowledge) are left out of the features", latest_path, dropped
        )
    vector_type = vectors.schema["vector"]
    if not isinstance(vector_type, pl.Array):
        raise ValueError(f"{vectors_path}: column 'vector' is {vector_type}, not a fixed-size array")
    tables = FeatureTables(out, vector_type.size, row_type)
    for etype in ENTITY_TYPES:
        _write_table(joined.filter(pl.col("entity_type") == etype), etype, tables)
    return tables


def _write_table(frame: pl.DataFrame, entity_type: str, tables: FeatureTables) -> None:
    path = tables.table(entity_type)
    table = frame.select(
        pl.col("entity_id").alias(f"{entity_type}_id"),
        pl.col("generated_at").alias("event_timestamp"),
        *row_spec(tables.row_type).features,
        pl.col("vector").arr.to_list().cast(pl.List(pl.Float32)).alias(VECTOR),
    ).to_arrow()
    atomic_write_local(Path(path), lambda tmp: pq.write_table(table, tmp))
    log.info("features: %d %ss -> %s", table.num_rows, entity_type, path)


def read_feature_table(path: str | Path) -> pa.Table:
    return pq.read_table(path)
