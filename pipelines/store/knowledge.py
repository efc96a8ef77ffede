"""Knowledge Parquet, the job's output format: the knowledge row (:class:`KnowledgeRow`, every column defined
once), its writer and its readers, on the generic sharded store (:mod:`pipelines.store.shards`: atomic
shards, append-only log, checkpoints, compaction, checksums, quarantine, done keys, failures.jsonl).

The Arrow schema (:data:`KNOWLEDGE_SCHEMA`), the columns a row may omit, the index columns
(:func:`read_index`), the latest view's columns (pipelines/ops/schedule/latest.py) and the feature store's
features (pipelines/ops/features/) are all read from :class:`KnowledgeRow`'s fields: a column is added
there and nowhere else. Old knowledge (the pools' source) lives in the same format in its own store.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import polars as pl
import pyarrow as pa

from pipelines.store.frames import as_frame
from pipelines.store.shards import (
    COMPACT_AFTER,
    COMPACT_ROWS,
    KEY_COLUMNS,
    ShardedWriter,
    iter_tables,
    scan_store,
    utc_now,
)
from pipelines.store.location import Location

log = logging.getLogger(__name__)

# ---- the knowledge row: every column defined once --------------------------------------------------------


def column(
    arrow: pa.DataType,
    doc: str,
    nullable: bool = True,
    feature: bool = False,
    index: bool = False,
    stamped: bool = False,
) -> Any:
    """A :class:`KnowledgeRow` field: its Arrow type, nullability and one-line doc; ``feature``: served by the
    feature store (pipelines/ops/features); ``index``: read by :func:`read_index`. Nullable columns and the
    writer's own (``generated_at``) default to None; the others must be given."""
    meta = {"arrow": arrow, "nullable": nullable, "doc": doc, "feature": feature, "index": index}
    if nullable or stamped:
        return field(default=None, metadata=meta)
    return field(metadata=meta)


STAMPED = ("generated_at",)  # the writer sets it (the driver's clock), not the row's maker


@dataclass(slots=True, kw_only=True)
class KnowledgeRow:
    """One generated text and how it was made: a row of the knowledge store. The Arrow schema
    (:data:`KNOWLEDGE_SCHEMA`), the optional and index columns, the latest view's and the feature store's
    columns all come from these fields, in this order. Null in shards written before a column existed."""

    entity_type: str = column(pa.string(), '"user" | "item"', nullable=False, index=True)
    entity_id: str = column(pa.string(), "the entity's id", nullable=False, index=True)
    knowledge: str = column(pa.string(), "the generated text", nullable=False, feature=True)
    model: str = column(pa.string(), "the target model", nullable=False)
    decoder: str = column(pa.string(), "the decoder's registered name", nullable=False)
    decoder_params: str = column(
        pa.string(), "JSON object, keys sorted (pipelines.workers.encode_params)", nullable=False
    )
    prompt_version: str = column(pa.string(), "the prompt templates' version", nullable=False)
    pool_kind: str | None = column(pa.string(), '"collaborative" | "attribute" | null (no pool)')
    group_id: str | None = column(pa.string(), "the retrieval pool's group")
    n_tokens: int = column(pa.int32(), "generated tokens", nullable=False)
    target_forwards: int = column(pa.int32(), "forward passes of the target model", nullable=False)
    accepted_tokens: int = column(pa.int32(), "draft tokens accepted in total", nullable=False)
    retrieval_s: float = column(pa.float64(), "seconds spent drafting from pools", nullable=False)
    generation_s: float = column(pa.float64(), "prefill + decode seconds", nullable=False)
    finish_reason: str = column(pa.string(), "eos, length, stop (a stop string), loop (retry.py)", nullable=False)
    run_id: str = column(pa.string(), "the run that wrote the row", nullable=False, feature=True, index=True)
    generated_at: datetime | None = column(
        pa.timestamp("us", tz="UTC"), "the writer's (driver's) UTC clock", nullable=False, index=True, stamped=True
    )
    # quality (pipelines/quality/, computed from the text when absent) and timing detail
    finished_eos: bool | None = column(pa.bool_(), "ended by EOS")
    repeat_4gram: float | None = column(pa.float64(), "share of word 4-grams that repeat an earlier one")
    degenerate: bool | None = column(pa.bool_(), "too short or looping")
    greedy_retry: bool | None = column(pa.bool_(), "regenerated greedily after a flawed first text (retry_greedy)")
    prefill_s: float | None = column(pa.float64(), "prefill seconds")
    decode_s: float | None = column(pa.float64(), "decode seconds")
    source_hash: str | None = column(
        pa.string(), "hash of the prompt's inputs (staleness check)", feature=True, index=True
    )
    sampling: str | None = column(pa.string(), "JSON: temperature, top_p, top_k, the entity's seed")
    # how the text ended and what it says (pipelines/quality/)
    ended: bool | None = column(pa.bool_(), "by EOS or at a sentence end")
    cut: bool | None = column(pa.bool_(), "at the token limit mid-sentence")
    fragment: bool | None = column(pa.bool_(), "not at a sentence end, unbalanced brackets/quotes or garbage")
    n_words: int | None = column(pa.int32(), "words in the text")
    asked_words: int | None = column(pa.int32(), 'the prompt\'s "at most N words"')
    facts_mentioned: int | None = column(pa.int32(), "titles, genres, ratings (users); genres, years (items)")
    grounding: float | None = column(pa.float64(), "share of the mentioned facts the input supports; null: none")
    engine: str | None = column(pa.string(), 'what decoded the row: "hf" | "vllm" (execution.engine)')
    prompt_tokens: int | None = column(pa.int32(), "the prompt's tokens; null where the engine did not count them")
    cached_prompt_tokens: int | None = column(pa.int32(), "of them, served from the prefix cache (hf: 0)")
    # what decided the text besides its inputs (pipelines/knowledge/provenance.py) and the run's place in the
    # ledger's sequence
    config_hash: str | None = column(pa.string(), "model, decoder and params, rules, prompt version", index=True)
    run_seq: int | None = column(pa.int64(), "the driver's run sequence: the latest view orders by it", index=True)
    own_accepted_tokens: int | None = column(pa.int32(), "accepted drafts from the entity's earlier text")

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> "KnowledgeRow":
        """A row from a dict of columns; a ValueError names the row's key and the unknown or missing columns."""
        spec = row_spec(cls)
        unknown = [k for k in row if k not in spec.names]
        missing = [k for k in spec.required if k not in row]
        key = f"{row.get('entity_type')}/{row.get('entity_id')}"
        if unknown:
            raise ValueError(
                f"row for {key} has unknown column(s) {unknown}; the knowledge row's columns are "
                f"KnowledgeRow's fields (pipelines/store/knowledge.py)"
            )
        if missing:
            raise ValueError(f"row for {key} lacks {missing}")
        return cls(**row)

    def as_dict(self) -> dict[str, Any]:
        """{column: value} in schema order: what the Arrow table is built from."""
        return {name: getattr(self, name) for name in row_spec(type(self)).names}


@dataclass(frozen=True)
class RowSpec:
    """What a row class's fields say, derived once per class: the Arrow schema and the column groups."""

    schema: pa.Schema
    names: tuple[str, ...]
    required: tuple[str, ...]  # what a row's maker must give: not nullable, not stamped by the writer
    optional: tuple[str, ...]  # what a row may omit: quality is computed from the text, the rest is null
    index: tuple[str, ...]
    features: tuple[str, ...]


_SPECS: dict[type[KnowledgeRow], RowSpec] = {}  # by row class: a dict, since mypy takes no class as Hashable


def row_spec(row_type: type[KnowledgeRow] = KnowledgeRow) -> RowSpec:
    """The :class:`RowSpec` of ``row_type`` (a subclass may add columns), derived once per class."""
    spec = _SPECS.get(row_type)
    if spec is None:
        spec = _SPECS[row_type] = _derive_spec(row_type)
    return spec


def _derive_spec(row_type: type[KnowledgeRow]) -> RowSpec:
    cols = [(f.name, f.metadata) for f in dataclasses.fields(row_type)]
    schema = pa.schema([pa.field(n, m["arrow"], nullable=m["nullable"]) for n, m in cols])
    required = tuple(n for n, m in cols if not m["nullable"] and n not in STAMPED)
    optional = tuple(n for n, m in cols if m["nullable"])
    return RowSpec(
        schema,
        tuple(schema.names),
        required,
        optional,
        tuple(n for n, m in cols if m["index"]),
        tuple(n for n, m in cols if m["feature"]),
    )


KNOWLEDGE_SCHEMA = row_spec().schema
OPTIONAL_COLUMNS = row_spec().optional  # columns a row may omit: quality is computed from the text, the rest is null

# what change detection and the latest view read instead of the texts (:func:`read_index`); ``_pos`` is added:
# the row's position in the store's write order (compaction keeps it), to fetch chosen rows' texts later
INDEX_COLUMNS = row_spec().index
POSITION = "_pos"


def with_quality(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` with the quality columns it lacks computed from its text and finish reason."""
    from pipelines.quality import text_quality

    out = dict.fromkeys(OPTIONAL_COLUMNS) | dict(row)
    scores = out["finished_eos"] is None or out["repeat_4gram"] is None or out["degenerate"] is None
    if scores or out["ended"] is None:  # the text is scored once for both groups
        q = text_quality(str(out["knowledge"]), str(out["finish_reason"]))
        if scores:
            out.update(finished_eos=q.finished_eos, repeat_4gram=q.repeat_4gram, degenerate=q.degenerate)
        if out["ended"] is None:  # text-only flags; grounding needs the entity's input and stays null
            out.update(ended=q.ended, cut=q.cut, fragment=q.fragment, n_words=q.n_words)
    if out["greedy_retry"] is None:
        out["greedy_retry"] = False
    return out


class KnowledgeWriter(ShardedWriter):
    """Writes knowledge rows (:class:`KnowledgeRow`, or a Mapping of its columns converted at the door) as
    shards of a sharded store (:class:`pipelines.store.shards.ShardedWriter`): quality computed from the text
    when absent, each row stamped with the driver's clock and run sequence. ``row_type``: the row class whose
    fields are the store's columns (a subclass may add columns)."""

    row_type: type[KnowledgeRow] = KnowledgeRow
    stamped = STAMPED

    def __init__(
        self,
        store: str | Path | Location,
        shard_rows: int = 256,
        run_id: str = "",
        run_seq: int | None = None,
        compact_after: int | None = COMPACT_AFTER,
        compact_rows: int = COMPACT_ROWS,
    ) -> None:
        self.schema = row_spec(self.row_type).schema
        self.run_seq = run_seq
        super().__init__(store, shard_rows, run_id, compact_after, compact_rows)

    def complete(self, row: KnowledgeRow | Mapping[str, Any]) -> dict[str, Any]:
        """The row as {column: value}; a Mapping is converted first (a ValueError names the row and its unknown
        or missing columns)."""
        if isinstance(row, KnowledgeRow):
            if not isinstance(row, self.row_type):
                raise TypeError(f"{self.store}: a {type(row).__name__} given to a writer of {self.row_type.__name__}")
            return row.as_dict()
        try:
            return self.row_type.from_mapping(row).as_dict()
        except ValueError as exc:
            raise ValueError(f"{self.store}: {exc}") from None

    def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        """Quality computed from the text, stamped with the writer's (the driver's) UTC clock and run sequence:
        no worker's clock orders the latest view."""
        return with_quality(row) | {"generated_at": utc_now(), "run_seq": self.run_seq}

    def __enter__(self) -> "KnowledgeWriter":
        return self


# ---- readers: never modify the store ---------------------------------------------------------------------


def iter_knowledge(
    store: str | Path | Location,
    columns: Sequence[str] | None = None,
    batch_rows: int = 65536,
    rows: Sequence[int] | None = None,
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> Iterator[pa.RecordBatch]:
    """The store's rows as Arrow record batches of at most ``batch_rows`` rows, in write order, without
    dedup: ``columns`` only (every column of ``row_type`` by default), and only the rows at the sorted
    positions ``rows`` when given (the ``_pos`` of :func:`read_index`). Memory holds one shard at a time."""
    root = Location.of(store)
    cols = list(columns) if columns is not None else None
    for _, table in iter_tables(root, scan_store(root), cols, row_spec(row_type).schema, rows):
        yield from table.to_batches(max_chunksize=batch_rows)


def _dedup(frame: pl.DataFrame, root: Location) -> pl.DataFrame:
    """The first row per (entity_type, entity_id, run_id): a safeguard, since the writer never writes a
    key twice within a resumed run."""
    kept = frame.unique(subset=[*KEY_COLUMNS, "run_id"], keep="first", maintain_order=True)
    if kept.height < frame.height:
        log.warning("%s: dropped %d duplicate knowledge rows", root, frame.height - kept.height)
    return kept


def read_knowledge_arrow(
    store: str | Path | Location, dedup: bool = True, row_type: type[KnowledgeRow] = KnowledgeRow
) -> pa.Table:
    """All committed shards as one Arrow table in write order (``dedup``: see :func:`_dedup`), with the
    columns of ``row_type``."""
    root = Location.of(store)
    schema = row_spec(row_type).schema
    tables = [t for _, t in iter_tables(root, scan_store(root), None, schema)]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if dedup and table.num_rows:
        frame = _dedup(as_frame(table), root)
        if frame.height < table.num_rows:
            table = frame.to_arrow().cast(schema)
    return table


def read_knowledge(
    store: str | Path | Location, dedup: bool = True, row_type: type[KnowledgeRow] = KnowledgeRow
) -> pl.DataFrame:
    """All knowledge in ``store`` as one polars frame (see :func:`read_knowledge_arrow`)."""
    return as_frame(read_knowledge_arrow(store, dedup=dedup, row_type=row_type))


INDEX_SCHEMA = pa.schema([KNOWLEDGE_SCHEMA.field(c) for c in INDEX_COLUMNS] + [pa.field(POSITION, pa.int64())])


def read_index(store: str | Path | Location) -> pl.DataFrame:
    """What change detection and the latest view need of every row, without its text: the columns
    :data:`INDEX_COLUMNS` (Parquet column projection: no ``knowledge`` bytes are decoded) and ``_pos``, the
    row's position in write order; deduplicated as :func:`read_knowledge` is."""
    root = Location.of(store)
    tables = []
    for start, table in iter_tables(root, scan_store(root), INDEX_COLUMNS, KNOWLEDGE_SCHEMA):
        tables.append(table.append_column(POSITION, pa.array(range(start, start + table.num_rows), pa.int64())))
    index = pa.concat_tables(tables).cast(INDEX_SCHEMA) if tables else INDEX_SCHEMA.empty_table()
    return _dedup(as_frame(index), root)


def knowledge_at(store: str | Path | Location, rows: pl.DataFrame) -> dict[tuple[str, str], str]:
    """{(entity_type, entity_id): knowledge} of the rows of :func:`read_index` in ``rows`` (their ``_pos``):
    only the shards that hold them are read, and of those only the key and text columns."""
    if rows.height == 0:
        return {}
    positions = sorted(rows[POSITION].to_list())
    batches = iter_knowledge(store, [*KEY_COLUMNS, "knowledge"], rows=positions)
    found = {(t, i): k for b in batches for t, i, k in zip(*(b.column(c).to_pylist() for c in b.schema.names))}
    if set(found) != set(zip(rows["entity_type"], rows["entity_id"])):
        raise ValueError(f"{store}: the store changed between its index and its texts; read it again")
    return found


def knowledge_texts(store: str | Path | Location, entity_type: str | None = None) -> dict[tuple[str, str], str]:
    """{(entity_type, entity_id): knowledge} over a store; the input pools are built from."""
    frame = read_knowledge(store)
    if entity_type is not None:
        frame = frame.filter(pl.col("entity_type") == entity_type)
    return {(t, i): k for t, i, k in frame.select("entity_type", "entity_id", "knowledge").iter_rows()}
