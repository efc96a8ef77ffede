"""Knowledge Parquet: the job's output format, written in atomic shards with a manifest.

A knowledge store is a directory::

    <store>/manifest.json               shards and their row counts (atomically replaced)
    <store>/part-00000.parquet ...      one shard per ``shard_rows`` rows (temp file + fsync + rename)
    <store>/failures.jsonl              entities that could not be generated (id, reason, run_id)

Crash safety: a shard becomes visible only by ``os.replace`` of a fully written, fsynced temp file, so
a shard on disk is always complete. The manifest is replaced after each shard; a shard renamed just
before a crash but missing from the manifest is read anyway and adopted when a writer next opens the
store. Readers never modify the store, so they may run while a job writes. Resume reads
:func:`done_keys` and skips those entities, so a re-run neither loses nor duplicates rows.
Old knowledge (the pools' source) lives in the same format in its own store directory.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

KNOWLEDGE_SCHEMA = pa.schema(
    [
        pa.field("entity_type", pa.string(), nullable=False),  # "user" | "item"
        pa.field("entity_id", pa.string(), nullable=False),
        pa.field("knowledge", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("decoder", pa.string(), nullable=False),
        pa.field("decoder_params", pa.string(), nullable=False),  # JSON object, keys sorted
        pa.field("prompt_version", pa.string(), nullable=False),
        pa.field("pool_kind", pa.string()),  # "collaborative" | "attribute" | null (no pool)
        pa.field("group_id", pa.string()),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("target_forwards", pa.int32(), nullable=False),
        pa.field("accepted_tokens", pa.int32(), nullable=False),  # draft tokens accepted in total
        pa.field("retrieval_s", pa.float64(), nullable=False),
        pa.field("generation_s", pa.float64(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),  # "eos" | "length"
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("generated_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # quality (pipelines/quality.py) and timing detail; null in shards written before they existed
        pa.field("finished_eos", pa.bool_()),
        pa.field("repeat_4gram", pa.float64()),  # share of word 4-grams that repeat an earlier one
        pa.field("degenerate", pa.bool_()),
        pa.field("greedy_retry", pa.bool_()),  # regenerated greedily after a degenerate first text
        pa.field("prefill_s", pa.float64()),
        pa.field("decode_s", pa.float64()),
        pa.field("source_hash", pa.string()),  # hash of the prompt's inputs (staleness check); null in old shards
    ]
)
# columns a row may omit: quality is computed from the text, the rest is null
OPTIONAL_COLUMNS = ("finished_eos", "repeat_4gram", "degenerate", "greedy_retry", "prefill_s", "decode_s")
KEY_COLUMNS = ("entity_type", "entity_id")
FAILURE_COLUMNS = ("entity_type", "entity_id", "reason", "run_id", "failed_at")

MANIFEST = "manifest.json"
FAILURES = "failures.jsonl"
QUARANTINE = "quarantine"  # corrupt shards are moved here by the next writer; their entities are regenerated
_SHARD_RE = re.compile(r"^part-(\d{5,})\.parquet$")


def encode_params(params: Mapping[str, Any]) -> str:
    """Decoder parameters as the canonical JSON string stored in ``decoder_params``."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def utc_now() -> datetime:
    """The current time as a timezone-aware UTC datetime (the ``generated_at`` value)."""
    return datetime.now(timezone.utc)


class CorruptShardError(ValueError):
    """A shard whose bytes do not match the manifest's sha256, or that Parquet cannot read."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_shard(root: Path, shard: Mapping[str, Any], columns: list[str] | None = None) -> pa.Table:
    """One shard, checked against the manifest's sha256 (when recorded) before Parquet reads it."""
    path = root / shard["file"]
    expected = shard.get("sha256")
    if expected and file_sha256(path) != expected:
        raise CorruptShardError(f"{path}: checksum mismatch with {root / MANIFEST}; the shard is corrupt (the next "
                                f"run moves it to {QUARANTINE}/ and regenerates its entities)")
    try:
        if columns is not None:
            return pq.read_table(path, columns=columns)
        return pq.read_table(path, schema=KNOWLEDGE_SCHEMA)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptShardError(f"{path}: unreadable shard ({exc})") from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0o666 minus the process umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write_bytes(path: Path, write: Any) -> None:
    """Write ``path`` through a temp file in the same directory: ``write(tmp_path)``, fsync, rename.

    ``mkstemp`` creates the temp file 0600; it gets the umask-derived mode of a normal write instead.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, file_mode())
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_json_atomic(path: Path, obj: Any) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text(json.dumps(obj, indent=1))

    _atomic_write_bytes(path, write)


@dataclass
class Manifest:
    """The store's table of contents: shard file names in write order, with their row counts."""

    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    @classmethod
    def load(cls, store: Path) -> "Manifest":
        path = store / MANIFEST
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            return cls(shards=list(data["shards"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: unreadable knowledge manifest ({exc})") from exc

    def save(self, store: Path) -> None:
        _write_json_atomic(store / MANIFEST, {"format": "laser-knowledge/1", "shards": self.shards})


def _shard_files(store: Path) -> list[str]:
    return sorted(p.name for p in store.glob("part-*.parquet") if _SHARD_RE.match(p.name))


def scan_store(store: str | Path) -> Manifest:
    """The store's shards, read-only: the manifest plus complete shards it does not list yet (a shard is
    renamed into place before the manifest is replaced, so such a shard is whole)."""
    root = Path(store)
    if not root.exists():
        return Manifest()
    manifest = Manifest.load(root)
    listed = {s["file"] for s in manifest.shards}
    for name in _shard_files(root):
        if name not in listed:
            manifest.shards.append({"file": name, "rows": pq.ParquetFile(root / name).metadata.num_rows, "run_id": None})
    return manifest


def open_store(store: str | Path) -> Manifest:
    """For a writer: create ``store``, drop stale temp files, adopt shards missing from the manifest."""
    root = Path(store)
    root.mkdir(parents=True, exist_ok=True)
    for tmp in root.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    listed = len(Manifest.load(root).shards)
    manifest = scan_store(root)
    if len(manifest.shards) > listed:
        log.warning("%s: adopted %d shards missing from the manifest", root, len(manifest.shards) - listed)
        manifest.save(root)
    if quarantine_corrupt(root, manifest):
        manifest.save(root)
    return manifest


def with_quality(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` with the quality columns it lacks computed from its text and finish reason."""
    from pipelines.quality import text_quality

    out = {c: None for c in OPTIONAL_COLUMNS} | dict(row)
    if out["finished_eos"] is None or out["repeat_4gram"] is None or out["degenerate"] is None:
        q = text_quality(str(out["knowledge"]), str(out["finish_reason"]))
        out.update(finished_eos=q.finished_eos, repeat_4gram=q.repeat_4gram, degenerate=q.degenerate)
    if out["greedy_retry"] is None:
        out["greedy_retry"] = False
    return out


def quarantine_corrupt(root: Path, manifest: Manifest) -> list[str]:
    """Move corrupt shards to ``quarantine/`` and out of ``manifest`` (not saved here); their entities
    are then missing, so a resumed or incremental run regenerates them. Returns the moved file names."""
    moved = []
    for shard in list(manifest.shards):
        try:
            read_shard(root, shard, columns=list(KEY_COLUMNS))
        except CorruptShardError as exc:
            log.error("%s; quarantined", exc)
            (root / QUARANTINE).mkdir(exist_ok=True)
            os.replace(root / shard["file"], root / QUARANTINE / shard["file"])
            manifest.shards.remove(shard)
            moved.append(shard["file"])
    return moved


class KnowledgeWriter:
    """Buffers knowledge rows and writes them as atomic Parquet shards of ``shard_rows`` rows.

    Use as a context manager (``close`` flushes the last partial shard); ``add`` validates each row
    against :data:`KNOWLEDGE_SCHEMA` so a malformed row fails loudly naming the entity.
    """

    def __init__(self, store: str | Path, shard_rows: int = 256, run_id: str = "") -> None:
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.store = Path(store)
        self.shard_rows = shard_rows
        self.run_id = run_id
        self.manifest = open_store(self.store)
        self._buffer: list[dict[str, Any]] = []
        self.rows_written = 0
        self.failures_written = 0

    def add(self, row: Mapping[str, Any]) -> None:
        """Queue one knowledge row; writes a shard when ``shard_rows`` rows are queued."""
        missing = [f.name for f in KNOWLEDGE_SCHEMA if f.name not in row and not f.nullable]
        if missing:
            raise ValueError(f"knowledge row for {row.get('entity_type')}/{row.get('entity_id')} lacks {missing}")
        self._buffer.append(with_quality({f.name: None for f in KNOWLEDGE_SCHEMA if f.nullable} | dict(row)))
        if len(self._buffer) >= self.shard_rows:
            self.flush()

    def add_failure(self, entity_type: str, entity_id: str, reason: str) -> None:
        """Record one entity that could not be generated; appended and fsynced at once."""
        rec = {"entity_type": entity_type, "entity_id": str(entity_id), "reason": reason, "run_id": self.run_id,
               "failed_at": utc_now().isoformat()}
        with open(self.store / FAILURES, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.failures_written += 1

    def flush(self) -> None:
        """Write the queued rows as one shard (temp file, fsync, rename), then replace the manifest."""
        if not self._buffer:
            return
        try:
            table = pa.Table.from_pylist(self._buffer, schema=KNOWLEDGE_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"{self.store}: knowledge rows do not match the schema: {exc}") from exc
        existing = [int(_SHARD_RE.match(s["file"]).group(1)) for s in self.manifest.shards]
        name = f"part-{max(existing, default=-1) + 1:05d}.parquet"
        _atomic_write_bytes(self.store / name, lambda tmp: pq.write_table(table, tmp))
        self.manifest.shards.append({"file": name, "rows": table.num_rows, "run_id": self.run_id,
                                     "sha256": file_sha256(self.store / name)})
        self.manifest.save(self.store)
        self.rows_written += table.num_rows
        self._buffer.clear()
        log.debug("%s: wrote %s (%d rows)", self.store, name, table.num_rows)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "KnowledgeWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # rows already generated are kept even when the job fails


def read_knowledge_arrow(store: str | Path, dedup: bool = True) -> pa.Table:
    """All shards listed in the store's manifest as one Arrow table in write order.

    ``dedup`` keeps the first row per (entity_type, entity_id, run_id): a safeguard, since the writer
    never writes a key twice within a resumed run.
    """
    root = Path(store)
    manifest = scan_store(root)
    tables = [read_shard(root, s) for s in manifest.shards]  # a corrupt shard raises, never read silently
    table = pa.concat_tables(tables) if tables else KNOWLEDGE_SCHEMA.empty_table()
    if dedup and table.num_rows:
        frame = pl.from_arrow(table).unique(subset=[*KEY_COLUMNS, "run_id"], keep="first", maintain_order=True)
        if frame.height < table.num_rows:
            log.warning("%s: dropped %d duplicate knowledge rows", root, table.num_rows - frame.height)
            table = frame.to_arrow().cast(KNOWLEDGE_SCHEMA)
    return table


def read_knowledge(store: str | Path, dedup: bool = True) -> pl.DataFrame:
    """All knowledge in ``store`` as one polars frame (see :func:`read_knowledge_arrow`)."""
    return pl.from_arrow(read_knowledge_arrow(store, dedup=dedup))


def done_keys(store: str | Path) -> set[tuple[str, str]]:
    """(entity_type, entity_id) pairs already written to ``store``: what a resumed run skips."""
    root = Path(store)
    manifest = scan_store(root)
    keys: set[tuple[str, str]] = set()
    for shard in manifest.shards:
        try:
            t = read_shard(root, shard, columns=list(KEY_COLUMNS))
        except CorruptShardError as exc:  # not done: its entities are generated again
            log.error("%s", exc)
            continue
        keys.update(zip(t.column("entity_type").to_pylist(), t.column("entity_id").to_pylist()))
    return keys


def read_failures(store: str | Path, unresolved: bool = True) -> pl.DataFrame:
    """Recorded failures; ``unresolved`` drops entities that a later run did write."""
    path = Path(store) / FAILURES
    schema = {c: pl.Utf8 for c in FAILURE_COLUMNS}
    if not path.exists():
        return pl.DataFrame(schema=schema)
    recs = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line from a crash mid-append
            log.warning("%s:%d: skipped unreadable failure record", path, lineno)
    frame = pl.DataFrame(recs, schema=schema) if recs else pl.DataFrame(schema=schema)
    if unresolved and frame.height:
        done = done_keys(store)
        frame = frame.filter([(t, i) not in done for t, i in zip(frame["entity_type"], frame["entity_id"])])
    return frame.unique(subset=list(KEY_COLUMNS), keep="last", maintain_order=True)


def knowledge_texts(store: str | Path, entity_type: str | None = None) -> dict[tuple[str, str], str]:
    """{(entity_type, entity_id): knowledge} over a store; the input pools are built from."""
    frame = read_knowledge(store)
    if entity_type is not None:
        frame = frame.filter(pl.col("entity_type") == entity_type)
    return {(t, i): k for t, i, k in frame.select("entity_type", "entity_id", "knowledge").iter_rows()}

