"""A sharded Parquet store: rows of one schema written in atomic shards committed to an append-only log.

The store knows a row schema and key columns, given by its user (the knowledge store,
:mod:`pipelines.store.knowledge`; recommendations, :mod:`pipelines.recommend.store`); nothing here knows
what a row means. A store is a directory, local or at an fsspec URI (``s3://``, ``gs://``, ``memory://``;
:mod:`pipelines.store.location`)::

    <store>/part-00000.parquet ...      one shard per ``shard_rows`` rows (``part-00000-<8 hex>.parquet``
                                        off local disks); ``part-00063-c-<8 hex>.parquet``: a compaction
    <store>/log/000000000042.jsonl      one small line per commit: a shard added (file, rows, run_id,
                                        sha256), or small shards replaced by their compaction; local: one
                                        file appended to until the next checkpoint, elsewhere one object
                                        per line (named by the first line's sequence number)
    <store>/manifest.json               a checkpoint: the shard list up to a log entry (``log_seq``)
    <store>/failures.jsonl              entities that could not be written (id, reason, run_id)

The committed shard list is the checkpoint plus the log entries after it, in order. A commit writes one
log line, so its cost does not grow with the store; a writer folds the log into a new checkpoint once
the log is as long as the checkpoint (at least :data:`CHECKPOINT_MIN` entries) and when it closes, then
deletes the log's files. Stores written before the log (a manifest alone) read as a checkpoint.

Crash safety, local: a shard becomes visible only by ``os.replace`` of a fully written, fsynced temp
file, so a shard on disk is always complete; its log line is then appended and fsynced (the commit). A
last line a crash cut short is ignored; a shard renamed just before a crash but not committed is read
anyway and adopted when a writer next opens the store. On filesystems without atomic rename (object
stores): each shard is one put under a unique name, then its log entry is put as a new object (an
exclusive create): that put is the commit. Readers trust only what is committed there; a shard object a crash left
uncommitted is ignored by readers and deleted by the next writer, and its entities are generated again.
Either way readers never modify the store, so they may run while a job writes, and resume reads
:func:`done_keys` (the committed shards) and skips those entities, so a re-run neither loses nor
duplicates rows.

Compaction (:func:`compact_store`; a writer runs it once :data:`COMPACT_AFTER` small shards have piled
up) merges runs of neighbouring small shards into one, in order, so row positions do not move (a writer
takes the shards it committed itself from the tables it wrote, not from disk): it writes the merged shard,
commits a log entry that replaces the small ones, then deletes them. Killed before the commit, the merged
shard is uncommitted (ignored, deleted by the next writer); after it, the replaced shards are ``retired``
(never read, deleted by the next writer). A reader whose shard a compaction
deleted under it goes on from the same row in the merged shard.

Checksums: each shard's sha256 is committed with it and checked when the shard is read (local files
once per file version per process), not when a store is opened; ``open_shards(verify=True)`` checks every
shard and moves corrupt ones to ``quarantine/`` so that their entities are generated again. A torn
checkpoint or log entry is rebuilt from the shards (sha256 computed) by the next writer; readers rebuild
it in memory.

One writer per store: a writer (and :func:`open_shards`) holds the lock of the store's own folder
(``<store>/.run.lock``, :mod:`pipelines.store.lock`) besides the output's, so jobs that share a store (a shared
``old_knowledge.path``) never write it at once: the second stops with the lock's exit code (75).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.store.lock import check_held, output_lock
from pipelines.store.location import Location, StorageError, atomic_write_local, fsync_dir

log = logging.getLogger(__name__)

KEY_COLUMNS = ("entity_type", "entity_id")  # the default row key, and the failures file's
FAILURE_COLUMNS = ("entity_type", "entity_id", "reason", "run_id", "failed_at")

MANIFEST = "manifest.json"  # the checkpoint
LOG = "log"
FORMAT = "laser-knowledge/2"
FAILURES = "failures.jsonl"
QUARANTINE = "quarantine"  # corrupt shards are moved here by the next writer; their entities are regenerated
CHECKPOINT_MIN = 64  # log entries a writer lets pile up at least before it writes a checkpoint
COMPACT_AFTER = 64  # small shards (under a quarter of COMPACT_ROWS rows) that make a writer compact
COMPACT_ROWS = 65536  # rows of a merged shard, at most
# the 8 hex digits: unique names off local disks; "-c": a compaction's merged shard (its number is its last
# source's, so shard numbers keep the write order)
_SHARD_RE = re.compile(r"^part-(\d{5,})(-c)?(?:-[0-9a-f]{8})?\.parquet$")
_LOG_RE = re.compile(r"^(\d{12})\.jsonl$")  # a log file, named by its first entry's sequence number
_REPLACES = b"laser.replaces"  # a merged shard's Parquet metadata: the shards it replaces (for a rebuild)
_VERIFY_SLACK_NS = 2_000_000_000  # a file modified this close to its check is checked again on the next read


def utc_now() -> datetime:
    """The current time as a timezone-aware UTC datetime (the ``generated_at`` value)."""
    return datetime.now(timezone.utc)


class CorruptShardError(ValueError):
    """A shard whose bytes do not match its committed sha256, or that Parquet cannot read."""


class TornManifestError(ValueError):
    """A checkpoint or log entry that is no readable shard list (a torn or hand-edited file): :func:`open_shards`
    rebuilds the store's checkpoint from the shards, readers (:func:`scan_store`) rebuild it in memory."""


class _LogMoved(Exception):
    """A log entry vanished while it was read (a writer folded it into a checkpoint): read again."""


def file_sha256(path: str | Path | Location) -> str:
    return hashlib.sha256(Location.of(path).read_bytes()).hexdigest()


# local shard path -> (size, mtime_ns, sha256, checked at) of a shard whose bytes matched its sha256
_VERIFIED: dict[str, tuple[int, int, str, int]] = {}


def _verified_local(path: Location, expected: str) -> bool:
    """Whether this file version was checked already: same size and mtime, modified well before the check
    (a write in the same clock tick as the check could keep the mtime)."""
    try:
        st = os.stat(path.path)
    except FileNotFoundError:
        return False
    seen = _VERIFIED.get(path.path)
    return (
        seen is not None
        and seen[:3] == (st.st_size, st.st_mtime_ns, expected)
        and st.st_mtime_ns < seen[3] - _VERIFY_SLACK_NS
    )


def _shard_source(root: Location, shard: Mapping[str, Any]) -> str | pa.BufferReader:
    """What Parquet reads a shard from, once its bytes match the committed sha256 (when recorded)."""
    path = root / shard["file"]
    expected = shard.get("sha256")
    if path.local and (not expected or _verified_local(path, expected)):
        if not os.path.exists(path.path):
            raise CorruptShardError(f"{path}: committed in {root} but missing")
        return path.path  # Parquet then reads only the columns asked for
    try:
        st = os.stat(path.path) if path.local else None  # before the read: a later change is checked again
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise CorruptShardError(f"{path}: committed in {root} but missing") from exc
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise CorruptShardError(
            f"{path}: checksum mismatch with its committed sha256; the shard is corrupt (the "
            f"next run moves it to {QUARANTINE}/ and regenerates its entities)"
        )
    if st is not None and expected:
        if len(_VERIFIED) > 200_000:
            _VERIFIED.clear()
        _VERIFIED[path.path] = (st.st_size, st.st_mtime_ns, expected, time.time_ns())
    return pa.BufferReader(data)


def read_shard(
    root: str | Path | Location,
    shard: Mapping[str, Any],
    columns: Sequence[str] | None = None,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """One shard, checked against its committed sha256 (when recorded) before Parquet reads it; only
    ``columns`` when given. ``schema``: the store's row schema, so that columns a shard lacks (written before
    they existed) read as null; None: the shard's own."""
    root = Location.of(root)
    source = _shard_source(root, shard)
    cols = list(columns) if columns is not None else None
    if schema is not None and cols is not None and not set(cols) <= set(schema.names):
        schema = None  # columns outside the row schema: the shard's own
    try:
        table = pq.read_table(source, columns=cols, schema=schema)
    except FileNotFoundError as exc:  # deleted between the check and the read (a compaction)
        raise CorruptShardError(f"{root / shard['file']}: committed in {root} but missing") from exc
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptShardError(f"{root / shard['file']}: unreadable shard ({exc})") from exc
    return table.replace_schema_metadata(None)


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` serialised as one Parquet file, in memory (written with one atomic put)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _write_shard(path: Location, table: pa.Table) -> str:
    """Write one shard whole (local: temp file + fsync + rename; elsewhere one put); its sha256."""
    if path.local:
        atomic_write_local(Path(path.local_path), lambda tmp: pq.write_table(table, tmp))
        return file_sha256(path)
    data = parquet_bytes(table)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


# ---- the committed shard list: checkpoint + log ----------------------------------------------------------


@dataclass
class Manifest:
    """The store's table of contents: shard file names in write order, with their row counts (and sha256s);
    ``log_seq``: the newest log entry it includes; ``retired``: shards a committed compaction replaced, perhaps
    not deleted yet (never read, never adopted)."""

    shards: list[dict[str, Any]] = field(default_factory=list)
    log_seq: int = -1
    retired: list[str] = field(default_factory=list)
    checkpoint_seq: int = -1  # the log_seq of the checkpoint it was read from: entries after it are pending
    checkpoint_shards: int = 0  # shards in that checkpoint
    log_file: str | None = None  # the local log file this writer appends to (a new one after each checkpoint)

    @property
    def n_rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    @property
    def pending(self) -> int:
        """Log entries not yet folded into a checkpoint."""
        return self.log_seq - self.checkpoint_seq

    @classmethod
    def load(cls, store: str | Path | Location) -> "Manifest":
        """The committed shard list: the checkpoint (empty when there is none) and the log entries after it;
        :class:`TornManifestError` when either is not a readable list of shard entries (``file``, ``rows``)."""
        root = Location.of(store)
        for _ in range(5):
            try:
                return cls._load(root)
            except _LogMoved:
                continue
        raise TornManifestError(f"{root / LOG}: the log keeps changing or has a gap in its sequence")

    @classmethod
    def _load(cls, root: Location) -> "Manifest":
        manifest = cls._checkpoint(root / MANIFEST)
        files = _log_files(root)
        for n, path in enumerate(files):
            try:
                lines = path.read_bytes().split(b"\n")
            except FileNotFoundError:  # folded into a checkpoint since it was listed
                raise _LogMoved() from None
            for k, line in enumerate(lines):
                last = n == len(files) - 1 and k == len(lines) - 1
                if line.strip():
                    manifest._replay(path, line, last)
        return manifest

    def _replay(self, path: Location, line: bytes, last: bool) -> None:
        """Apply one log line (when newer than the checkpoint); an unreadable last line of the last log file
        is a commit a crash cut short (ignored), any other is a torn log."""
        try:
            entry = json.loads(line)
            seq = entry["seq"]
            if seq <= self.log_seq:
                return
            if seq != self.log_seq + 1:  # a gap: entries folded (deleted) while listed, or lost
                raise _LogMoved()
            self.apply(entry)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            if last:
                return
            raise TornManifestError(f"{path}: unreadable knowledge log entry ({exc})") from exc
        self.log_seq = seq

    @classmethod
    def _checkpoint(cls, path: Location) -> "Manifest":
        if not path.exists():
            return cls()
        try:
            body = json.loads(path.read_text())
            shards, seq, retired = body["shards"], body.get("log_seq", -1), body.get("retired", [])
            if not isinstance(shards, list) or not all(_is_entry(s) for s in shards):
                raise TypeError("shards is not a list of {file, rows} entries")
            if not isinstance(seq, int) or not isinstance(retired, list):
                raise TypeError("log_seq or retired of the wrong type")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise TornManifestError(f"{path}: unreadable knowledge manifest ({exc})") from exc
        return cls(list(shards), seq, [str(r) for r in retired], seq, len(shards))

    def apply(self, entry: Mapping[str, Any]) -> None:
        """One log entry: ``add`` appends its shard; ``compact`` puts its shard where the first shard it
        replaces was and drops the others (their rows, in the same order)."""
        shard = entry["shard"]
        if not _is_entry(shard):
            raise TypeError(f"not a shard entry: {shard!r}")
        if entry["op"] == "add":
            self.shards.append(shard)
        elif entry["op"] == "compact":
            gone = set(entry["remove"])
            at = next((i for i, s in enumerate(self.shards) if s["file"] in gone), len(self.shards))
            kept = [s for s in self.shards if s["file"] not in gone]
            self.shards = kept[:at] + [shard] + kept[at:]
            self.retired.extend(sorted(gone - set(self.retired)))
        else:
            raise ValueError(f"unknown log operation {entry['op']!r}")

    @classmethod
    def rebuild(cls, store: str | Path | Location) -> tuple["Manifest", list[str]]:
        """The manifest the shard files make, in write (shard number) order, each with its row count, sha256 and
        run_id (when its rows share one); shards that a merged shard replaces are left out (``retired``).
        Returns it and the names of the shards Parquet cannot read."""
        root = Location.of(store)
        shards: list[dict[str, Any]] = []
        unreadable: list[str] = []
        replaced: set[str] = set()
        for name in sorted(_shard_files(root), key=lambda n: (_shard_number(n), n)):
            data = (root / name).read_bytes()
            try:
                pf = pq.ParquetFile(pa.BufferReader(data))
                runs = (
                    pf.read(columns=["run_id"]).column("run_id").unique().to_pylist()
                    if "run_id" in pf.schema_arrow.names
                    else []
                )
                replaced.update(json.loads((pf.schema_arrow.metadata or {}).get(_REPLACES, b"[]")))
            except (pa.ArrowInvalid, OSError, json.JSONDecodeError) as exc:
                log.error("%s: unreadable shard (%s)", root / name, exc)
                unreadable.append(name)
                continue
            shards.append(
                {
                    "file": name,
                    "rows": pf.metadata.num_rows,
                    "run_id": runs[0] if len(runs) == 1 else None,
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        kept = [s for s in shards if s["file"] not in replaced]
        return cls(kept, retired=sorted(s["file"] for s in shards if s["file"] in replaced)), unreadable

    def save(self, store: str | Path | Location) -> None:
        """Write the checkpoint atomically: the shard list through log entry ``log_seq``."""
        body = json.dumps(
            {"format": FORMAT, "log_seq": self.log_seq, "shards": self.shards, "retired": self.retired}, indent=1
        )
        (Location.of(store) / MANIFEST).write_text(body)


def _is_entry(shard: Any) -> bool:
    return (
        isinstance(shard, dict)
        and isinstance(shard.get("file"), str)
        and bool(_SHARD_RE.match(shard["file"]))
        and isinstance(shard.get("rows"), int)
    )


def _shard_match(name: str) -> re.Match[str]:
    match = _SHARD_RE.match(name)
    if match is None:  # callers pass names _shard_files matched
        raise ValueError(f"{name}: not a shard file name (part-<number>[-c][-<hex8>].parquet)")
    return match


def _shard_number(name: str) -> int:
    return int(_shard_match(name).group(1))


def _is_merged(name: str) -> bool:
    return _shard_match(name).group(2) is not None


def _shard_files(root: Location) -> list[str]:
    return [n for n in root.names("part-*.parquet") if _SHARD_RE.match(n)]


def _log_files(root: Location) -> list[Location]:
    """The log's files in sequence order: local, one file a writer appends to between checkpoints; elsewhere
    one object per entry."""
    return [root / LOG / n for n in sorted((root / LOG).names("*.jsonl")) if _LOG_RE.match(n)]


def _put_log_entry(path: Location, data: bytes) -> None:
    """Commit one log line: local, appended to the log file ``path`` and fsynced (a new file: its folder too);
    elsewhere one exclusive put of a new object (object stores have no appends)."""
    if not path.local:
        if not path.create(data):
            raise StorageError(f"{path}: already committed by another writer; one writer per store")
        return
    new = not os.path.exists(path.path)
    with open(path.path, "ab") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if new:
        fsync_dir(path.parent.local_path)


def commit(root: Location, manifest: Manifest, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the store's log (the commit point), then to ``manifest`` in memory. Local stores
    append to one log file until the next checkpoint; the others put one object per entry."""
    seq = manifest.log_seq + 1
    if not root.local or manifest.log_file is None:
        manifest.log_file = f"{seq:012d}.jsonl"
    _put_log_entry(root / LOG / manifest.log_file, (json.dumps({"seq": seq, **entry}) + "\n").encode())
    manifest.apply(entry)  # only once committed: a failed commit leaves nothing listed twice
    manifest.log_seq = seq


def checkpoint(root: Location, manifest: Manifest) -> None:
    """Fold the log into a new checkpoint (atomic), then delete the log's files; killed between the two,
    readers skip the entries the checkpoint already holds. The next commit starts a new log file."""
    manifest.save(root)
    for path in _log_files(root):
        path.remove()
    manifest.log_file = None
    manifest.checkpoint_seq, manifest.checkpoint_shards = manifest.log_seq, len(manifest.shards)


def _unlisted(root: Location, manifest: Manifest) -> list[str]:
    """Shards on disk that are not committed and may hold rows not committed elsewhere: not merged shards
    (an uncommitted compaction: its rows are in its sources) and not retired ones."""
    skip = {s["file"] for s in manifest.shards} | set(manifest.retired)
    return [n for n in _shard_files(root) if n not in skip and not _is_merged(n)]


def scan_store(store: str | Path | Location) -> Manifest:
    """The store's shards, read-only: the committed ones, plus (local stores only) complete shards not
    committed yet: a local shard is renamed into place whole before its log entry is written. On other
    filesystems an uncommitted shard object is ignored. A torn checkpoint or log is rebuilt in memory from
    the shards (:meth:`Manifest.rebuild`); the next writer writes it back."""
    root = Location.of(store)
    if not root.exists():
        return Manifest()
    try:
        manifest = Manifest.load(root)
    except TornManifestError as exc:
        log.warning("%s; read from the shards instead (the next writer rewrites it)", exc)
        return Manifest.rebuild(root)[0]
    if not root.local:
        return manifest
    for name in _unlisted(root, manifest):
        try:
            rows = pq.ParquetFile(root.local_path / name).metadata.num_rows
        except (pa.ArrowInvalid, OSError) as exc:  # not committed: skipped, and moved aside
            log.error(
                "%s: unreadable shard not in the manifest, skipped (%s); the next writer moves it to %s/",
                root / name,
                exc,
                QUARANTINE,
            )
            continue
        manifest.shards.append({"file": name, "rows": rows, "run_id": None})
    return manifest


def _quarantine(root: Location, name: str) -> None:
    (root / QUARANTINE).mkdir(exist_ok=True)
    (root / name).move_to(root / QUARANTINE / name)


def _quarantine_unreadable_unlisted(root: Location, manifest: Manifest) -> list[str]:
    """Local stores: move shards that are not committed and Parquet cannot read to ``quarantine/``."""
    moved = []
    for name in _unlisted(root, manifest):
        try:
            pq.ParquetFile(root.local_path / name)
        except (pa.ArrowInvalid, OSError) as exc:
            _quarantine(root, name)
            log.error("%s: unreadable shard not in the manifest (%s); moved to %s/", root / name, exc, QUARANTINE)
            moved.append(name)
    return moved


def _drop_uncommitted(root: Location, manifest: Manifest) -> bool:
    """Delete what a crashed writer left: local temp files and merged shards never committed; retired shards
    (a compaction committed, then killed before it deleted them); elsewhere every shard object not committed
    (put before the crash; its entities are regenerated). Returns whether ``manifest.retired`` changed."""
    listed = {s["file"] for s in manifest.shards}
    if root.local:
        for folder in (root.local_path, root.local_path / LOG):
            for tmp in folder.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
        doomed = [n for n in _shard_files(root) if n not in listed and (_is_merged(n) or n in manifest.retired)]
    else:
        doomed = [n for n in _shard_files(root) if n not in listed]
    for name in doomed:
        (root / name).remove()
    if doomed:
        log.warning("%s: deleted %d uncommitted or replaced shard files", root, len(doomed))
    changed = bool(manifest.retired)
    manifest.retired = []
    return changed


def _rebuild_torn(root: Location) -> None:
    """Writers: replace a torn checkpoint or log by a checkpoint rebuilt from the shards
    (:meth:`Manifest.rebuild`), the shards Parquet cannot read moved to ``quarantine/`` first; one warning
    line. Killed half way, the checkpoint is still torn (it is replaced atomically, last) and the next writer
    rebuilds it again."""
    try:
        Manifest.load(root)
        return
    except TornManifestError as exc:
        torn = exc
    manifest, unreadable = Manifest.rebuild(root)
    for name in unreadable:
        _quarantine(root, name)
    checkpoint(root, manifest)  # every log file deleted: the shards were read instead
    moved = f"; {len(unreadable)} unreadable moved to {QUARANTINE}/" if unreadable else ""
    log.warning(
        "%s; rebuilt from the %d shards in the store (%d rows)%s", torn, len(manifest.shards), manifest.n_rows, moved
    )


def open_shards(
    store: str | Path | Location, key_columns: tuple[str, ...] = KEY_COLUMNS, verify: bool = True
) -> Manifest:
    """For a writer (one per store: the run lock): create ``store``, rebuild a torn checkpoint from the shards,
    drop what a crash left uncommitted, adopt complete local shards not committed, and fold the log into a
    checkpoint when it holds entries. ``verify`` (a job does it once a run, before it reads the store) checks
    every shard's sha256 and quarantines corrupt ones (``key_columns``, the store's row key, are read to check
    each); the hashes it checked are not checked again by reads in the same process. A writer opens without
    it: reads check checksums anyway."""
    root = Location.of(store)
    root.mkdir(parents=True, exist_ok=True)
    with output_lock(root, run_id="open-store"):  # the store's own lock; reentrant for its writer
        _rebuild_torn(root)
        manifest = Manifest.load(root)
        dirty = bool(_log_files(root)) or not (root / MANIFEST).exists()
        dirty = _drop_uncommitted(root, manifest) or dirty
        if root.local:
            (root / LOG).mkdir(exist_ok=True)
            _quarantine_unreadable_unlisted(root, manifest)
            adopted = [
                {
                    "file": n,
                    "rows": pq.ParquetFile(root.local_path / n).metadata.num_rows,
                    "run_id": None,
                    "sha256": file_sha256(root / n),
                }
                for n in _unlisted(root, manifest)
            ]
            if adopted:
                log.warning("%s: adopted %d shards missing from the manifest", root, len(adopted))
                manifest.shards.extend(adopted)
                dirty = True
        if verify and quarantine_corrupt(root, manifest, key_columns):
            dirty = True
        if dirty:
            checkpoint(root, manifest)
    return manifest


def quarantine_corrupt(
    root: str | Path | Location, manifest: Manifest, key_columns: tuple[str, ...] = KEY_COLUMNS
) -> list[str]:
    """Move corrupt shards to ``quarantine/`` and out of ``manifest`` (not saved here); their entities
    are then missing, so a resumed or incremental run regenerates them. Returns the moved file names."""
    root = Location.of(root)
    moved = []
    for shard in list(manifest.shards):
        try:
            read_shard(root, shard, columns=list(key_columns))
        except CorruptShardError as exc:
            log.error("%s; quarantined", exc)
            if (root / shard["file"]).exists():
                _quarantine(root, shard["file"])
            manifest.shards.remove(shard)
            moved.append(shard["file"])
    return moved


# ---- compaction ----------------------------------------------------------------------------------------


def _small(shard: Mapping[str, Any], target_rows: int) -> bool:
    """A shard worth merging: under a quarter of a merged shard (so a writer's merges rewrite each row once)."""
    return shard["rows"] < target_rows // 4


def _compaction_groups(shards: list[dict[str, Any]], target_rows: int) -> list[list[dict[str, Any]]]:
    """Runs of neighbouring small shards, each cut at ``target_rows`` rows; only runs of two or more."""
    groups: list[list[dict[str, Any]]] = [[]]
    for shard in shards:
        if not _small(shard, target_rows) or sum(s["rows"] for s in groups[-1]) + shard["rows"] > target_rows:
            groups.append([])
        if _small(shard, target_rows):
            groups[-1].append(shard)
    return [g for g in groups if len(g) > 1]


def _compact_group(
    root: Location, manifest: Manifest, group: list[dict[str, Any]], schema: pa.Schema, held: Mapping[str, pa.Table]
) -> bool:
    """Write the group's rows as one shard, commit it in their place, delete them (module docstring). A shard
    in ``held`` (its table as this writer wrote it) is not read back."""
    check_held()
    try:
        table = pa.concat_tables(
            [held[s["file"]] if s["file"] in held else read_shard(root, s, schema=schema) for s in group]
        )
    except CorruptShardError as exc:  # left as it is: a verifying open quarantines it
        log.error("%s; not compacted", exc)
        return False
    files = [s["file"] for s in group]
    runs = {s.get("run_id") for s in group}
    name = f"part-{_shard_number(files[-1]):05d}-c-{uuid.uuid4().hex[:8]}.parquet"
    marked = table.replace_schema_metadata({_REPLACES: json.dumps(files).encode()})
    entry = {
        "file": name,
        "rows": table.num_rows,
        "run_id": runs.pop() if len(runs) == 1 else None,
        "sha256": _write_shard(root / name, marked),
    }
    commit(root, manifest, {"op": "compact", "remove": files, "shard": entry})
    for file in files:
        (root / file).remove()
        manifest.retired.remove(file)
    return True


def compact_shards(
    root: str | Path | Location,
    manifest: Manifest,
    schema: pa.Schema,
    target_rows: int = COMPACT_ROWS,
    held: Mapping[str, pa.Table] | None = None,
) -> int:
    """Merge every run of neighbouring small shards in ``manifest`` (committed; the caller holds the store's
    lock); returns the number of shards replaced. ``held``: shard file -> the table its writer wrote (and
    committed) there, used instead of reading the file back."""
    root = Location.of(root)
    replaced = 0
    for group in _compaction_groups(manifest.shards, target_rows):
        if _compact_group(root, manifest, group, schema, held or {}):
            replaced += len(group)
    return replaced


def compact_store(
    store: str | Path | Location,
    schema: pa.Schema,
    key_columns: tuple[str, ...] = KEY_COLUMNS,
    target_rows: int = COMPACT_ROWS,
) -> int:
    """Merge the store's small shards into shards of up to ``target_rows`` rows, under the store's lock, and
    write a checkpoint; returns the number of shards replaced. Every row stays, once, in its place."""
    root = Location.of(store)
    root.mkdir(parents=True, exist_ok=True)
    with output_lock(root, run_id="compact"):
        manifest = open_shards(root, key_columns, verify=False)
        replaced = compact_shards(root, manifest, schema, target_rows)
        if manifest.pending:
            checkpoint(root, manifest)
    if replaced:
        log.info("%s: compacted %d shards into %d", root, replaced, len(manifest.shards))
    return replaced


_Writer = TypeVar("_Writer", bound="ShardedWriter")  # `with SomeWriter(...) as w`: w is a SomeWriter


class ShardedWriter:
    """Buffers rows and writes them as atomic Parquet shards of ``shard_rows`` rows.

    A store subclasses it with its ``schema`` and ``key_columns`` (and ``complete``/``prepare`` for what it
    adds to a row). Use as a context manager (``close`` flushes the last partial shard); ``add`` checks each
    row's required columns so a malformed row fails loudly naming its key. Once ``compact_after`` small shards
    have piled up, the writer merges them (``None``: never).
    """

    schema: pa.Schema
    key_columns: tuple[str, ...] = KEY_COLUMNS
    stamped: tuple[str, ...] = ()  # required columns the writer sets (``prepare``), not the row's maker

    def __init__(
        self,
        store: str | Path | Location,
        shard_rows: int = 256,
        run_id: str = "",
        compact_after: int | None = COMPACT_AFTER,
        compact_rows: int = COMPACT_ROWS,
    ) -> None:
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.store = Location.of(store)
        self.shard_rows = shard_rows
        self.run_id = run_id
        self.compact_after, self.compact_rows = compact_after, compact_rows
        self._lock = ExitStack()  # the store folder's lock, held until close (module docstring)
        self._lock.enter_context(output_lock(self.store, run_id=run_id))
        try:
            self.manifest = open_shards(self.store, self.key_columns, verify=False)
        except BaseException:
            self._lock.close()
            raise
        self._buffer: list[dict[str, Any]] = []
        # small shards this writer committed, as written, for its next compaction (at most compact_rows rows:
        # what that compaction holds in memory anyway)
        self._held: dict[str, pa.Table] = {}
        # the schema's names, once: iterating a pa.Schema builds a Field object per column (slow per row)
        self._required = tuple(f.name for f in self.schema if not f.nullable and f.name not in self.stamped)
        self._nulls = dict.fromkeys(f.name for f in self.schema if f.nullable)
        self.rows_written = 0
        self.failures_written = 0

    def add(self, row: Any) -> None:
        """Queue one row; writes a shard when ``shard_rows`` rows are queued."""
        self.add_rows([row])

    def add_rows(self, rows: Sequence[Any]) -> None:
        """Queue rows that belong together (e.g. one user's ranked items): they land in the same shard."""
        for row in rows:
            self._buffer.append(self.prepare(self.complete(row)))
        if len(self._buffer) >= self.shard_rows:
            self.flush()

    def complete(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The row with every column (absent nullable ones null); a ValueError names its key and the required
        columns it lacks."""
        missing = [name for name in self._required if name not in row]
        if missing:
            raise ValueError(f"{self.store}: row for {self.row_key(row)} lacks {missing}")
        return self._nulls | dict(row)

    def row_key(self, row: Mapping[str, Any]) -> str:
        return "/".join(str(row.get(c)) for c in self.key_columns)

    def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        """What the writer adds to a complete row before it is written (nothing here)."""
        return row

    # (entity_type, entity_id) -> source_hash of the requests this writer's failures come from, and the
    # generation config's hash (:meth:`note_inputs`); recorded with each failure
    failure_inputs: Mapping[tuple[str, str], str | None] = {}
    failure_config_hash: str | None = None

    def note_inputs(self, source_hashes: Mapping[tuple[str, str], str | None], config_hash: str | None) -> None:
        """What the requests written here are made from, so that each failure records it and a scheduled run
        can tell a failure that repeats on the same inputs and config (pipelines/ops/schedule/failures.py)."""
        self.failure_inputs = {(t, str(i)): h for (t, i), h in source_hashes.items()}
        self.failure_config_hash = config_hash

    def add_failure(self, entity_type: str, entity_id: str, reason: str) -> None:
        """Record one entity that could not be generated; appended and fsynced at once."""
        key = (entity_type, str(entity_id))
        rec = {
            "entity_type": entity_type,
            "entity_id": str(entity_id),
            "reason": reason,
            "run_id": self.run_id,
            "failed_at": utc_now().isoformat(),
            "source_hash": self.failure_inputs.get(key),
            "config_hash": self.failure_config_hash,
        }
        append_failures(self.store, [rec])
        self.failures_written += 1

    def flush(self) -> None:
        """Write the queued rows as one shard (temp file, fsync, rename), then commit it with one log entry."""
        if not self._buffer:
            return
        check_held()  # a lost lease on the output stops the run before it writes again
        try:
            table = pa.Table.from_pylist(self._buffer, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"{self.store}: rows do not match the schema: {exc}") from exc
        taken = [_shard_number(n) for n in [s["file"] for s in self.manifest.shards] + self.manifest.retired]
        number = max(taken, default=-1) + 1
        # local: the rename makes the name safe; elsewhere a unique name never meets an uncommitted object
        name = f"part-{number:05d}.parquet" if self.store.local else f"part-{number:05d}-{uuid.uuid4().hex[:8]}.parquet"
        entry = {
            "file": name,
            "rows": table.num_rows,
            "run_id": self.run_id,
            "sha256": _write_shard(self.store / name, table),
        }
        commit(self.store, self.manifest, {"op": "add", "shard": entry})  # readers trust only what is committed
        self.rows_written += table.num_rows
        self._buffer.clear()
        self._hold(name, table)
        log.debug("%s: wrote %s (%d rows)", self.store, name, table.num_rows)
        self._upkeep()

    def _hold(self, name: str, table: pa.Table) -> None:
        """Keep a small shard's table for the compaction that will merge it, while the kept rows fit one
        merged shard."""
        if (
            self.compact_after
            and _small({"rows": table.num_rows}, self.compact_rows)
            and sum(t.num_rows for t in self._held.values()) + table.num_rows <= self.compact_rows
        ):
            self._held[name] = table

    def _upkeep(self) -> None:
        """Merge small shards once enough piled up; fold the log into a checkpoint once it is as long as the
        checkpoint (so a checkpoint's cost, spread over the commits since the last, stays constant)."""
        shards = self.manifest.shards
        if self.compact_after and sum(_small(s, self.compact_rows) for s in shards) >= self.compact_after:
            compact_shards(self.store, self.manifest, self.schema, self.compact_rows, self._held)
            live = {s["file"] for s in self.manifest.shards}
            self._held = {name: t for name, t in self._held.items() if name in live}
        if self.manifest.pending >= max(CHECKPOINT_MIN, self.manifest.checkpoint_shards):
            checkpoint(self.store, self.manifest)

    def close(self) -> None:
        """Flush the last rows, write a checkpoint, then let go of the store's lock."""
        try:
            self.flush()
            if self.manifest.pending:
                check_held()
                checkpoint(self.store, self.manifest)
        finally:
            self._lock.close()

    def __enter__(self: _Writer) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # rows already generated are kept even when the job fails


# ---- readers: never modify the store ---------------------------------------------------------------------


def _locate(shards: list[dict[str, Any]], pos: int) -> tuple[int, int, int]:
    """(index, first row position) of the shard holding row ``pos``, and how many of its rows come before."""
    start = 0
    for i, shard in enumerate(shards):
        if pos < start + shard["rows"]:
            return i, start, pos - start
        start += shard["rows"]
    return len(shards), start, 0


def iter_tables(
    root: Location,
    manifest: Manifest,
    columns: Sequence[str] | None,
    schema: pa.Schema | None,
    rows: Sequence[int] | None = None,
) -> Iterator[tuple[int, pa.Table]]:
    """(first row position, table) per committed shard, in write order: ``columns`` only, and only the rows at
    the sorted positions ``rows`` when given (shards without any are not read). A shard that a compaction
    replaced while it was read is followed into the merged shard, from the same row (positions stay)."""
    shards, end = list(manifest.shards), manifest.n_rows
    i, start, skip = 0, 0, 0
    while i < len(shards) and start + skip < end:
        shard = shards[i]
        stop = min(start + shard["rows"], end)
        lo = hi = 0
        if rows is not None:
            lo, hi = bisect.bisect_left(rows, start + skip), bisect.bisect_left(rows, stop)
        if rows is None or hi > lo:
            try:
                table = read_shard(root, shard, columns, schema)
            except CorruptShardError:
                fresh = scan_store(root)
                if shard["file"] in {s["file"] for s in fresh.shards} or fresh.n_rows < end:
                    raise
                shards = fresh.shards
                i, start, skip = _locate(shards, start + skip)
                continue
            table = table.slice(skip, stop - start - skip)
            if rows is not None and hi - lo < table.num_rows:  # every row of the shard: no copy
                table = table.take(pa.array([p - start - skip for p in rows[lo:hi]], pa.int64()))
            yield start + skip, table
        i, start, skip = i + 1, start + shard["rows"], 0


def done_keys(store: str | Path | Location, key_columns: tuple[str, ...] = KEY_COLUMNS) -> set[tuple[str, ...]]:
    """Keys (by default (entity_type, entity_id) pairs) already written to ``store``: what a resumed run skips.
    A corrupt shard's keys are not done: its entities are generated again."""
    root = Location.of(store)
    keys: set[tuple[str, ...]] = set()
    for _ in range(5):  # again when a compaction replaced a shard while it was read (its keys are in the merged)
        if _add_keys(root, scan_store(root), key_columns, keys):
            break
    return keys


def _add_keys(root: Location, manifest: Manifest, key_columns: tuple[str, ...], keys: set) -> bool:
    """Add the keys of ``manifest``'s shards to ``keys``; False when a shard was replaced under the reader."""
    for shard in manifest.shards:
        try:
            t = read_shard(root, shard, columns=list(key_columns))
        except CorruptShardError as exc:
            if shard["file"] not in {s["file"] for s in scan_store(root).shards}:
                return False
            log.error("%s", exc)  # not done: its entities are generated again
            continue
        keys.update(zip(*(t.column(c).to_pylist() for c in key_columns)))
    return True


# what failures.jsonl lines may carry besides FAILURE_COLUMNS (absent in lines written before them: null):
# the inputs' source_hash and the generation config's hash of a failure; given_up and count on the line that
# records a scheduled run giving up on an entity after ``count`` identical failures
FAILURE_FIELDS = {
    **{c: pl.Utf8 for c in FAILURE_COLUMNS},
    "source_hash": pl.Utf8,
    "config_hash": pl.Utf8,
    "given_up": pl.Boolean,
    "count": pl.Int64,
}


def append_failures(store: str | Path | Location, records: list[dict[str, Any]]) -> None:
    """Append failure records (JSON lines) to ``store``'s failures.jsonl, fsynced; under the output's lock."""
    if not records:
        return
    data = "".join(json.dumps(r) + "\n" for r in records)
    check_held()
    path = Location.of(store) / FAILURES
    if path.local:
        with open(path.local_path, "a+b") as fh:
            if fh.tell() and (fh.seek(-1, os.SEEK_END), fh.read(1))[1] != b"\n":
                data = "\n" + data  # a torn last line (a crash mid-append) ends here, not inside the new record
            fh.write(data.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
    else:  # no appends on object stores: the whole (small) file is put again
        old = path.read_bytes() if path.exists() else b""
        path.write_bytes(old + (b"\n" if old and not old.endswith(b"\n") else b"") + data.encode())


def read_failures(store: str | Path | Location, unresolved: bool = True, every_line: bool = False) -> pl.DataFrame:
    """Recorded failures (columns :data:`FAILURE_FIELDS`), the newest line per entity; ``unresolved`` drops
    entities that a later run did write; ``every_line`` keeps every line, in the order written."""
    path = Location.of(store) / FAILURES
    if not path.exists():
        return pl.DataFrame(schema=FAILURE_FIELDS)
    recs = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a torn last line from a crash mid-append
            log.warning("%s:%d: skipped unreadable failure record", path, lineno)
            continue
        recs.append({c: rec.get(c) for c in FAILURE_FIELDS})
    frame = pl.DataFrame(recs, schema=FAILURE_FIELDS) if recs else pl.DataFrame(schema=FAILURE_FIELDS)
    if unresolved and frame.height:
        done = done_keys(store)
        frame = frame.filter([(t, i) not in done for t, i in zip(frame["entity_type"], frame["entity_id"])])
    return frame if every_line else frame.unique(subset=list(KEY_COLUMNS), keep="last", maintain_order=True)
