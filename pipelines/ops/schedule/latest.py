"""The "latest" view: one row per entity, its newest knowledge; what CTR training and the feature store read.

Built from the knowledge store (every run's rows) and the old-knowledge store (entities that only have
old knowledge, e.g. existing items); the row of the newest run wins: ordered by ``run_seq`` (the driver's
run sequence, so no node's clock decides), then by ``generated_at`` (the driver's UTC clock; rows
written before ``run_seq`` existed have none and count as older than every row that has one).

It is a **Delta Lake table**, ``<output>/latest/`` (delta-rs), partitioned by ``entity_type``, so Spark,
Trino, DuckDB, polars (``pl.read_delta``) and a feature store read it without this package, each version
whole or not at all, and any earlier version by number (time travel). Every run **merges** into it the rows
its stores committed since the version before: each commit records, per store, how many rows it has
taken (``laser.marks``), so a run reads only the newer part of the stores' index and rewrites only the
files that hold the entities it changed. A table without marks, or marks the stores no longer match
(a store rebuilt or its corrupt shards quarantined), is rebuilt whole (``laser latest CONFIG`` always is),
as a new version. Old versions' files go after :data:`RETENTION_HOURS` (Delta's ``vacuum``), small files
are merged once there are :data:`COMPACT_FILES` (``optimize``).

The newest row per entity is chosen from the stores' index (no texts); then only those rows are read,
streamed shard by shard, so memory holds the index, one shard and the rows merged.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import polars as pl
import pyarrow as pa

from pipelines.store.frames import as_frame
from pipelines.store.knowledge import POSITION, KnowledgeRow, iter_knowledge, read_index, row_spec
from pipelines.store.shards import KEY_COLUMNS
from pipelines.store.lock import check_held
from pipelines.store.location import Location, StorageError

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

log = logging.getLogger(__name__)

LATEST_TABLE = "latest"  # <output>/latest/: the Delta table
OLD_LATEST_FILE = "latest.parquet"  # the view's earlier form: removed once the table is written
MARKS = "laser.marks"  # commit metadata: {store: {"rows": n, "last": key of row n - 1}}
RUN_ID = "laser.run_id"  # commit metadata: the run that wrote the version
RETENTION_HOURS = 24 * 7  # Delta's default: a reader may time-travel a week back
COMPACT_FILES = 64  # optimize once the table has this many files
DELTA_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")  # besides local paths and file://
NEWER = (  # the merge's rule: a source row replaces the table's when it is at least as new
    "t.run_seq IS NULL OR (s.run_seq IS NOT NULL AND (s.run_seq > t.run_seq OR (s.run_seq = t.run_seq "
    "AND s.generated_at >= t.generated_at)))"
)


def newest_per_entity(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per (entity_type, entity_id): the newest by (``run_seq``, ``generated_at``)."""
    return (
        frame.sort(["run_seq", "generated_at"], nulls_last=False, maintain_order=True)
        .unique(subset=list(KEY_COLUMNS), keep="last", maintain_order=True)
        .sort(list(KEY_COLUMNS))
    )


def _stores(
    knowledge: str | Path | Location, old_knowledge: str | Path | Location | None
) -> dict[str, str | Path | Location]:
    return {"knowledge": knowledge} | ({"old_knowledge": old_knowledge} if old_knowledge is not None else {})


def _view_rows(
    stores: Mapping[str, str | Path | Location],
    index: pl.DataFrame,
    columns: Sequence[str] | None,
    row_type: type[KnowledgeRow],
) -> pl.DataFrame:
    """The rows of ``index`` (newest per entity, with a ``store`` column) read from their stores."""
    schema = row_spec(row_type).schema
    names = schema.names if columns is None else [c for c in KEY_COLUMNS if c not in columns] + list(columns)
    frames = []
    for name, where in stores.items():
        rows = index.filter(pl.col("store") == name)[POSITION].sort().to_list()
        batches = list(iter_knowledge(where, names, rows=rows, row_type=row_type))
        table = pa.Table.from_batches(batches, schema=pa.schema([schema.field(c) for c in names]))
        frames.append(as_frame(table).with_columns(store=pl.lit(name)))
    return pl.concat(frames).sort(list(KEY_COLUMNS))


def _indexes(stores: Mapping[str, str | Path | Location]) -> pl.DataFrame:
    return pl.concat([read_index(where).with_columns(store=pl.lit(name)) for name, where in stores.items()])


def latest_view(
    knowledge: str | Path | Location,
    old_knowledge: str | Path | Location | None = None,
    columns: Sequence[str] | None = None,
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> pl.DataFrame:
    """The newest row per entity over ``knowledge`` (and ``old_knowledge``), with a ``store`` column;
    ``columns`` only, with the key columns (every column of ``row_type``, the knowledge row, by default).
    Computed from the stores, not read from the table (the job's pools read it before the table is kept)."""
    stores = _stores(knowledge, old_knowledge)
    return _view_rows(stores, newest_per_entity(_indexes(stores)), columns, row_type)


# ---- the Delta table ------------------------------------------------------------------------------------


def delta_target(output: str | Path | Location) -> tuple[str, dict[str, str]]:
    """The latest table's URI and the storage options delta-rs opens it with (credentials and endpoints
    from the environment, as fsspec takes them). Raises :class:`StorageError` for a filesystem delta-rs
    cannot write (``memory://``, ``hdfs://``)."""
    loc = Location.of(output)
    table = loc / LATEST_TABLE
    if loc.local:
        return str(table.local_path.absolute()), {}
    scheme = str(loc).split("://", 1)[0]
    if scheme not in DELTA_SCHEMES:
        raise StorageError(
            f"{loc}: the latest view is a Delta Lake table, which delta-rs writes to local paths and "
            f"{', '.join(s + '://' for s in DELTA_SCHEMES)}; not {scheme}://"
        )
    options: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if scheme.startswith("s3") and endpoint.startswith("http://"):  # a local or on-premises S3
        options["AWS_ALLOW_HTTP"] = "true"
    return str(table).replace("s3a://", "s3://", 1), options


def _open(output: str | Path | Location, version: int | None = None) -> DeltaTable | None:
    """The latest table (a ``deltalake.DeltaTable``), or None where there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    uri, options = delta_target(output)
    try:
        return DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError:
        return None


def _marks(table: DeltaTable) -> dict[str, dict[str, Any]] | None:
    """The stores' rows the table's newest version has taken (its commit's ``laser.marks``)."""
    info = table.history(1)[0]
    raw = info.get(MARKS)
    return json.loads(raw) if isinstance(raw, str) else None


def _row_key(row: Mapping[str, Any]) -> str:
    return f"{row['entity_type']}/{row['entity_id']}/{row['run_id']}"


def _store_marks(indexes: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Per store: its row count (last position + 1) and the key of its last row."""
    marks = {}
    for (name,), frame in indexes.group_by("store"):
        last = frame.sort(POSITION).row(-1, named=True) if frame.height else None
        marks[str(name)] = {"rows": last[POSITION] + 1 if last else 0, "last": _row_key(last) if last else ""}
    return marks


def _still_holds(marks: Mapping[str, Mapping[str, Any]], indexes: pl.DataFrame) -> bool:
    """Whether every store still holds the rows ``marks`` names, in place (the table's marks are good)."""
    for name, mark in marks.items():
        frame = indexes.filter(pl.col("store") == name)
        if mark["rows"] == 0:
            continue
        at = frame.filter(pl.col(POSITION) == mark["rows"] - 1)
        if at.height != 1 or _row_key(at.row(0, named=True)) != mark["last"]:
            return False
    return True


def update_latest(
    output: str | Path | Location,
    knowledge: str | Path | Location,
    old_knowledge: str | Path | Location | None = None,
    run_id: str = "",
    rebuild: bool = False,
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> int:
    """Keep ``<output>/latest/`` up to date with the stores: merge the rows they committed since its last
    version (or write the whole view: ``rebuild``, a new table, or marks the stores no longer match).
    ``row_type``: the row whose columns the view has. Returns the entities written. Holds the output's lock
    (the caller's)."""
    from deltalake import CommitProperties

    check_held()
    stores = _stores(knowledge, old_knowledge)
    indexes = _indexes(stores)
    table, marks = _open(output), None
    if table is not None and not rebuild:
        marks = _marks(table)
        if marks is not None and not _still_holds(marks, indexes):
            log.warning("%s: the knowledge stores changed under the latest view; it is rebuilt whole", output)
            marks = None
    new_marks = _store_marks(indexes)
    commit = CommitProperties(custom_metadata={MARKS: json.dumps(new_marks), RUN_ID: run_id})
    uri, options = delta_target(output)
    with _naming(uri):
        return _write(output, (uri, options), stores, indexes, table, marks, commit, row_type)


@contextmanager
def _naming(uri: str) -> Iterator[None]:
    """delta-rs's I/O errors (a full disk, a refused write) name the table, as the stores' writes do."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), uri) from exc
        raise


def _write(
    output: str | Path | Location,
    target: tuple[str, dict[str, str]],
    stores: Mapping[str, str | Path | Location],
    indexes: pl.DataFrame,
    table: DeltaTable | None,
    marks: Mapping[str, Mapping[str, Any]] | None,
    commit: CommitProperties,
    row_type: type[KnowledgeRow],
) -> int:
    """The whole view as a new version (no ``marks``), or a merge of the rows after them."""
    from deltalake import write_deltalake

    uri, options = target  # delta_target(output)
    if table is None or marks is None:
        view = _view_rows(stores, newest_per_entity(indexes), None, row_type).to_arrow()
        write_deltalake(
            uri,
            view,
            mode="overwrite",
            schema_mode="overwrite",
            partition_by=["entity_type"],
            storage_options=options,
            commit_properties=commit,
        )
        log.info("latest view: %d entities -> %s (written whole)", view.num_rows, uri)
        _retire_parquet(output)
        return view.num_rows
    since = indexes  # the rows after each store's mark (all of a store the marks do not name)
    for name, mark in marks.items():
        since = since.filter((pl.col("store") != name) | (pl.col(POSITION) >= mark["rows"]))
    if since.height == 0:
        log.info("latest view: nothing new -> %s (version %d)", uri, table.version())
        return 0
    rows = _view_rows(stores, newest_per_entity(since), None, row_type).to_arrow()
    (
        table.merge(
            rows,
            predicate="t.entity_type = s.entity_type AND t.entity_id = s.entity_id",
            source_alias="s",
            target_alias="t",
            commit_properties=commit,
        )
        .when_matched_update_all(predicate=NEWER)
        .when_not_matched_insert_all()
        .execute()
    )
    _upkeep(table)
    log.info("latest view: %d entities merged -> %s (version %d)", rows.num_rows, uri, table.version())
    return rows.num_rows


def _upkeep(table: DeltaTable) -> None:
    """Small files merged once they pile up; files older versions alone need dropped past the retention."""
    table.update_incremental()
    if len(table.file_uris()) >= COMPACT_FILES:
        table.optimize.compact()
    table.vacuum(retention_hours=RETENTION_HOURS, dry_run=False)


def _retire_parquet(output: str | Path | Location) -> None:
    """The view's earlier single-file form goes once the table holds the view (no reader finds it stale)."""
    old = Location.of(output) / OLD_LATEST_FILE
    if old.exists():
        old.remove()
        log.info("%s: replaced by the Delta table %s/", old, LATEST_TABLE)


def read_latest(output: str | Path | Location, version: int | None = None) -> pl.DataFrame:
    """The latest view a run wrote (``<output>/latest/``, or the table's own path), sorted by key;
    ``version``: an earlier version of it (Delta time travel)."""
    loc = Location.of(output)
    base = loc.parent if loc.name == LATEST_TABLE else loc
    table = _open(base, version)
    if table is None:
        raise FileNotFoundError(
            f"{base / LATEST_TABLE}: no latest view; run `laser run CONFIG --incremental` or `laser latest CONFIG`"
        )
    frame = as_frame(table.to_pyarrow_table())
    order = [c for c in [*row_spec().schema.names, "store"] if c in frame.columns]
    return frame.select(order + [c for c in frame.columns if c not in order]).sort(list(KEY_COLUMNS))
