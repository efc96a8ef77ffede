"""Knowledge Parquet: the job's output format, written in atomic shards with a manifest.

A knowledge store is a directory, local or at an fsspec URI (``s3://``, ``gs://``, ``memory://``;
:mod:`pipelines.storage`)::

    <store>/manifest.json               shards, row counts and sha256s (atomically replaced)
    <store>/part-00000.parquet ...      one shard per ``shard_rows`` rows (``part-00000-<8 hex>.parquet``
                                        off local disks)
    <store>/failures.jsonl              entities that could not be generated (id, reason, run_id)

Crash safety, local: a shard becomes visible only by ``os.replace`` of a fully written, fsynced temp
file, so a shard on disk is always complete. The manifest is replaced after each shard; a shard renamed
just before a crash but missing from the manifest is read anyway and adopted when a writer next opens
the store. On filesystems without atomic rename (object stores): each shard is one put under a unique
name, then the manifest is put: that put is the commit. Readers trust only what the manifest lists; a
shard object a crash left unlisted is ignored by readers and deleted by the next writer, and its
entities are generated again. Either way readers never modify the store, so they may run while a job
writes, and resume reads :func:`done_keys` (the manifest's shards) and skips those entities, so a
re-run neither loses nor duplicates rows.
Old knowledge (the pools' source) lives in the same format in its own store directory.

One writer per store: a writer (and :func:`open_store`) holds the lock of the store's own folder
(``<store>/.run.lock``, :mod:`pipelines.lock`) besides the output's, so jobs that share a store (a shared
``old_knowledge.path``) never write it at once: the second stops with the lock's exit code (75).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.lock import check_held, output_lock
from pipelines.storage import Location, atomic_write_local, file_mode  # noqa: F401  (file_mode: re-exported)

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
        pa.field("finish_reason", pa.string(), nullable=False),  # eos, length, stop (a stop string), loop (retry.py)
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("generated_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # quality (pipelines/quality.py) and timing detail; null in shards written before they existed
        pa.field("finished_eos", pa.bool_()),
        pa.field("repeat_4gram", pa.float64()),  # share of word 4-grams that repeat an earlier one
        pa.field("degenerate", pa.bool_()),
        pa.field("greedy_retry", pa.bool_()),  # regenerated greedily after a flawed first text (policy retry, retry_greedy)
        pa.field("prefill_s", pa.float64()),
        pa.field("decode_s", pa.float64()),
        pa.field("source_hash", pa.string()),  # hash of the prompt's inputs (staleness check); null in old shards
        pa.field("sampling", pa.string()),  # JSON: temperature, top_p, top_k, the entity's seed; null in old shards
        # how the text ended and what it says (pipelines/quality.py); null in shards written before
        pa.field("ended", pa.bool_()),  # by EOS or at a sentence end
        pa.field("cut", pa.bool_()),  # at the token limit mid-sentence
        pa.field("fragment", pa.bool_()),  # not at a sentence end, unbalanced brackets/quotes or garbage
        pa.field("n_words", pa.int32()),
        pa.field("asked_words", pa.int32()),  # the prompt's "at most N words"
        pa.field("facts_mentioned", pa.int32()),  # titles, genres, ratings (users); genres, years (items)
        pa.field("grounding", pa.float64()),  # share of the mentioned facts the input supports; null: none
        pa.field("engine", pa.string()),  # what decoded the row: "hf" | "vllm" (execution.engine); null in old shards
        pa.field("prompt_tokens", pa.int32()),  # the prompt's tokens; null where the engine did not count them
        pa.field("cached_prompt_tokens", pa.int32()),  # of them, served from the prefix cache (hf: 0, it has none)
        # what decided the text besides its inputs (model, decoder and params, generation rules, prompt version:
        # pipelines/knowledge/provenance.py) and the run's place in the ledger's sequence; null in old shards
        pa.field("config_hash", pa.string()),
        pa.field("run_seq", pa.int64()),  # the driver's run sequence: the latest view orders by it, not by clocks
        pa.field("own_accepted_tokens", pa.int32()),  # accepted drafts from the entity's earlier text; null: not counted
    ]
)
# columns a row may omit: quality is computed from the text, the rest is null
OPTIONAL_COLUMNS = ("finished_eos", "repeat_4gram", "degenerate", "greedy_retry", "prefill_s", "decode_s", "ended",
                    "cut", "fragment", "n_words", "asked_words", "facts_mentioned", "grounding", "engine",
                    "prompt_tokens", "cached_prompt_tokens", "config_hash", "run_seq",
                    "own_accepted_tokens")
KEY_COLUMNS = ("entity_type", "entity_id")
FAILURE_COLUMNS = ("entity_type", "entity_id", "reason", "run_id", "failed_at")

MANIFEST = "manifest.json"
FAILURES = "failures.jsonl"
QUARANTINE = "quarantine"  # corrupt shards are moved here by the next writer; their entities are regenerated
_SHARD_RE = re.compile(r"^part-(\d{5,})(?:-[0-9a-f]{8})?\.parquet$")  # the suffix: unique names off local disks


def encode_params(params: Mapping[str, Any]) -> str:
    """Decoder parameters as the canonical JSON string stored in ``decoder_params``."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def utc_now() -> datetime:
    """The current time as a timezone-aware UTC datetime (the ``generated_at`` value)."""
    return datetime.now(timezone.utc)


class CorruptShardError(ValueError):
    """A shard whose bytes do not match the manifest's sha256, or that Parquet cannot read."""


class TornManifestError(ValueError):
    """A manifest that is no readable shard list (a torn or hand-edited file): :func:`open_store` rebuilds it
    from the shards, readers (:func:`scan_store`) rebuild it in memory."""


def file_sha256(path: str | Path | Location) -> str:
    return hashlib.sha256(Location.of(path).read_bytes()).hexdigest()


def read_shard(root: str | Path | Location, shard: Mapping[str, Any], columns: list[str] | None = None,
               schema: pa.Schema = KNOWLEDGE_SCHEMA) -> pa.Table:
    """One shard, checked against the manifest's sha256 (when recorded) before Parquet reads it.

    ``schema`` is the store's row schema (knowledge by default; other stores reuse this machinery)."""
    root = Location.of(root)
    path = root / shard["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise CorruptShardError(f"{path}: listed in {root / MANIFEST} but missing") from exc
    expected = shard.get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise CorruptShardError(f"{path}: checksum mismatch with {root / MANIFEST}; the shard is corrupt (the next "
                                f"run moves it to {QUARANTINE}/ and regenerates its entities)")
    try:
        if columns is not None:
            return pq.read_table(pa.BufferReader(data), columns=columns)
        return pq.read_table(pa.BufferReader(data), schema=schema)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptShardError(f"{path}: unreadable shard ({exc})") from exc


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` serialised as one Parquet file, in memory (written with one atomic put)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _write_shard(path: Location, table: pa.Table) -> str:
    """Write one shard whole (local: temp file + fsync + rename; elsewhere one put); its sha256."""
    if path.local:
        _atomic_write_bytes(path.local_path, lambda tmp: pq.write_table(table, tmp))
        return file_sha256(path)
    data = parquet_bytes(table)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _atomic_write_bytes(path: Path, write: Any) -> None:
    """Local atomic write through ``write(tmp_path)`` (see :func:`pipelines.storage.atomic_write_local`)."""
    atomic_write_local(Path(path), write)


@dataclass
class Manifest:
    """The store's table of contents: shard file names in write order, with their row counts."""

    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    @classmethod
    def load(cls, store: str | Path | Location) -> "Manifest":
        """The manifest on disk (empty when there is none); :class:`TornManifestError` when it is not a list of
        shard entries (``file``, ``rows``)."""
        path = Location.of(store) / MANIFEST
        if not path.exists():
            return cls()
        try:
            shards = json.loads(path.read_text())["shards"]
            if not isinstance(shards, list) or not all(_is_entry(s) for s in shards):
                raise TypeError("shards is not a list of {file, rows} entries")
            return cls(shards=list(shards))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise TornManifestError(f"{path}: unreadable knowledge manifest ({exc})") from exc

    @classmethod
    def rebuild(cls, store: str | Path | Location) -> tuple["Manifest", list[str]]:
        """The manifest the shard files make, in write (shard number) order, each with its row count, sha256 and
        run_id (when its rows share one); returns it and the names of the shards Parquet cannot read."""
        root = Location.of(store)
        shards, unreadable = [], []
        for name in sorted(_shard_files(root), key=lambda n: (int(_SHARD_RE.match(n).group(1)), n)):
            data = (root / name).read_bytes()
            try:
                meta = pq.ParquetFile(pa.BufferReader(data)).metadata
                runs = (pq.read_table(pa.BufferReader(data), columns=["run_id"]).column("run_id").unique().to_pylist()
                        if "run_id" in meta.schema.names else [])
            except (pa.ArrowInvalid, OSError) as exc:
                log.error("%s: unreadable shard (%s)", root / name, exc)
                unreadable.append(name)
                continue
            shards.append({"file": name, "rows": meta.num_rows, "run_id": runs[0] if len(runs) == 1 else None,
                           "sha256": hashlib.sha256(data).hexdigest()})
        return cls(shards), unreadable

    def save(self, store: str | Path | Location) -> None:
        """Replace the manifest atomically: the commit point of every shard it lists."""
        body = json.dumps({"format": "laser-knowledge/1", "shards": self.shards}, indent=1)
        (Location.of(store) / MANIFEST).write_text(body)


def _is_entry(shard: Any) -> bool:
    return isinstance(shard, dict) and isinstance(shard.get("file"), str) and bool(_SHARD_RE.match(shard["file"])) \
        and isinstance(shard.get("rows"), int)


def _shard_files(root: Location) -> list[str]:
    return [n for n in root.names("part-*.parquet") if _SHARD_RE.match(n)]


def scan_store(store: str | Path | Location) -> Manifest:
    """The store's shards, read-only: the manifest, plus (local stores only) complete shards it does not
    list yet: a local shard is renamed into place whole before the manifest is replaced. On other
    filesystems an unlisted shard object was never committed and is ignored. A torn manifest is rebuilt
    in memory from the shards (:meth:`Manifest.rebuild`); the next writer writes it back."""
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
        except (pa.ArrowInvalid, OSError) as exc:  # not listed, so never committed: skipped, and moved aside
            log.error("%s: unreadable shard not in the manifest, skipped (%s); the next writer moves it to %s/",
                      root / name, exc, QUARANTINE)
            continue
        manifest.shards.append({"file": name, "rows": rows, "run_id": None})
    return manifest


def _unlisted(root: Location, manifest: Manifest) -> list[str]:
    listed = {s["file"] for s in manifest.shards}
    return [n for n in _shard_files(root) if n not in listed]


def _quarantine_unreadable_unlisted(root: Location, manifest: Manifest) -> list[str]:
    """Local stores: move shards that the manifest does not list and Parquet cannot read to ``quarantine/``."""
    moved = []
    for name in _unlisted(root, manifest):
        try:
            pq.ParquetFile(root.local_path / name)
        except (pa.ArrowInvalid, OSError) as exc:
            (root / QUARANTINE).mkdir(exist_ok=True)
            (root / name).move_to(root / QUARANTINE / name)
            log.error("%s: unreadable shard not in the manifest (%s); moved to %s/", root / name, exc, QUARANTINE)
            moved.append(name)
    return moved


def _drop_uncommitted(root: Location, manifest: Manifest) -> None:
    """Delete what a crashed writer left uncommitted: local temp files; elsewhere shard objects that the
    manifest does not list (put before the crash, never committed; their entities are regenerated)."""
    if root.local:
        for tmp in root.local_path.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        return
    listed = {s["file"] for s in manifest.shards}
    orphans = [n for n in _shard_files(root) if n not in listed]
    for name in orphans:
        (root / name).remove()
    if orphans:
        log.warning("%s: deleted %d uncommitted shard objects", root, len(orphans))


def _rebuild_torn(root: Location) -> None:
    """Writers: replace a torn manifest by one rebuilt from the shards (:meth:`Manifest.rebuild`), the shards
    Parquet cannot read moved to ``quarantine/`` first; one warning line. Killed half way, the manifest is
    still torn (it is replaced atomically, last) and the next writer rebuilds it again."""
    try:
        Manifest.load(root)
        return
    except TornManifestError as exc:
        torn = exc
    manifest, unreadable = Manifest.rebuild(root)
    for name in unreadable:
        (root / QUARANTINE).mkdir(exist_ok=True)
        (root / name).move_to(root / QUARANTINE / name)
    manifest.save(root)
    moved = f"; {len(unreadable)} unreadable moved to {QUARANTINE}/" if unreadable else ""
    log.warning("%s; rebuilt from the %d shards in the store (%d rows)%s", torn, len(manifest.shards),
                manifest.n_rows, moved)


def open_store(store: str | Path | Location, key_columns: tuple[str, ...] = KEY_COLUMNS) -> Manifest:
    """For a writer (one per store: the run lock): create ``store``, rebuild a torn manifest from the shards,
    drop what a crash left uncommitted, adopt complete local shards missing from the manifest, quarantine
    corrupt shards (``key_columns``, the store's row key, are read to check each shard)."""
    root = Location.of(store)
    root.mkdir(parents=True, exist_ok=True)
    with output_lock(root, run_id="open-store"):  # the store's own lock; reentrant for its writer
        _rebuild_torn(root)
        _drop_uncommitted(root, Manifest.load(root))
        if root.local:
            _quarantine_unreadable_unlisted(root, Manifest.load(root))
        listed = len(Manifest.load(root).shards)
        manifest = scan_store(root)
        if len(manifest.shards) > listed:
            log.warning("%s: adopted %d shards missing from the manifest", root, len(manifest.shards) - listed)
            manifest.save(root)
        if quarantine_corrupt(root, manifest, key_columns):
            manifest.save(root)
    return manifest


def with_quality(row: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` with the quality columns it lacks computed from its text and finish reason."""
    from pipelines.quality import text_quality

    out = {c: None for c in OPTIONAL_COLUMNS} | dict(row)
    if out["finished_eos"] is None or out["repeat_4gram"] is None or out["degenerate"] is None:
        q = text_quality(str(out["knowledge"]), str(out["finish_reason"]))
        out.update(finished_eos=q.finished_eos, repeat_4gram=q.repeat_4gram, degenerate=q.degenerate)
    if out["ended"] is None:  # text-only flags; grounding needs the entity's input and stays null
        q = text_quality(str(out["knowledge"]), str(out["finish_reason"]))
        out.update(ended=q.ended, cut=q.cut, fragment=q.fragment, n_words=q.n_words)
    if out["greedy_retry"] is None:
        out["greedy_retry"] = False
    return out


def quarantine_corrupt(root: str | Path | Location, manifest: Manifest,
                       key_columns: tuple[str, ...] = KEY_COLUMNS) -> list[str]:
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
                (root / QUARANTINE).mkdir(exist_ok=True)
                (root / shard["file"]).move_to(root / QUARANTINE / shard["file"])
            manifest.shards.remove(shard)
            moved.append(shard["file"])
    return moved


class KnowledgeWriter:
    """Buffers knowledge rows and writes them as atomic Parquet shards of ``shard_rows`` rows.

    Use as a context manager (``close`` flushes the last partial shard); ``add`` validates each row
    against :data:`KNOWLEDGE_SCHEMA` so a malformed row fails loudly naming the entity. Other stores in
    the same format subclass it with their own ``schema``, ``key_columns`` and ``prepare``.
    """

    schema: pa.Schema = KNOWLEDGE_SCHEMA
    key_columns: tuple[str, ...] = KEY_COLUMNS

    stamped: tuple[str, ...] = ("generated_at",)  # set by the writer (the driver's clock), not by the row's maker

    def __init__(self, store: str | Path, shard_rows: int = 256, run_id: str = "", run_seq: int | None = None) -> None:
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.store = Location.of(store)
        self.shard_rows = shard_rows
        self.run_id = run_id
        self.run_seq = run_seq
        self._lock = ExitStack()  # the store folder's lock, held until close (module docstring)
        self._lock.enter_context(output_lock(self.store, run_id=run_id))
        try:
            self.manifest = open_store(self.store, self.key_columns)
        except BaseException:
            self._lock.close()
            raise
        self._buffer: list[dict[str, Any]] = []
        self.rows_written = 0
        self.failures_written = 0

    def add(self, row: Mapping[str, Any]) -> None:
        """Queue one knowledge row; writes a shard when ``shard_rows`` rows are queued."""
        self.add_rows([row])

    def add_rows(self, rows: list[Mapping[str, Any]]) -> None:
        """Queue rows that belong together (e.g. one user's ranked items): they land in the same shard."""
        for row in rows:
            missing = [f.name for f in self.schema if f.name not in row and not f.nullable and f.name not in self.stamped]
            if missing:
                raise ValueError(f"{self.store}: row for {self.row_key(row)} lacks {missing}")
            self._buffer.append(self.prepare({f.name: None for f in self.schema if f.nullable} | dict(row)))
        if len(self._buffer) >= self.shard_rows:
            self.flush()

    def row_key(self, row: Mapping[str, Any]) -> str:
        return "/".join(str(row.get(c)) for c in self.key_columns)

    def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        """A complete row from what was added (knowledge: quality computed from the text), stamped with the
        writer's (the driver's) UTC clock and run sequence: no worker's clock orders the latest view."""
        return with_quality(row) | {"generated_at": utc_now(), "run_seq": self.run_seq}

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
        rec = {"entity_type": entity_type, "entity_id": str(entity_id), "reason": reason, "run_id": self.run_id,
               "failed_at": utc_now().isoformat(), "source_hash": self.failure_inputs.get(key),
               "config_hash": self.failure_config_hash}
        append_failures(self.store, [rec])
        self.failures_written += 1

    def flush(self) -> None:
        """Write the queued rows as one shard (temp file, fsync, rename), then replace the manifest."""
        if not self._buffer:
            return
        check_held()  # a lost lease on the output stops the run before it writes again
        try:
            table = pa.Table.from_pylist(self._buffer, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"{self.store}: rows do not match the schema: {exc}") from exc
        existing = [int(_SHARD_RE.match(s["file"]).group(1)) for s in self.manifest.shards]
        number = max(existing, default=-1) + 1
        # local: the rename makes the name safe; elsewhere a unique name never meets an uncommitted object
        name = f"part-{number:05d}.parquet" if self.store.local else f"part-{number:05d}-{uuid.uuid4().hex[:8]}.parquet"
        entry = {"file": name, "rows": table.num_rows, "run_id": self.run_id,
                 "sha256": _write_shard(self.store / name, table)}
        Manifest(self.manifest.shards + [entry]).save(self.store)  # the commit: readers trust only what it lists
        self.manifest.shards.append(entry)  # only once committed: a failed commit leaves nothing listed twice
        self.rows_written += table.num_rows
        self._buffer.clear()
        log.debug("%s: wrote %s (%d rows)", self.store, name, table.num_rows)

    def close(self) -> None:
        """Flush the last rows, then let go of the store's lock."""
        try:
            self.flush()
        finally:
            self._lock.close()

    def __enter__(self) -> "KnowledgeWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # rows already generated are kept even when the job fails


def read_knowledge_arrow(store: str | Path, dedup: bool = True) -> pa.Table:
    """All shards listed in the store's manifest as one Arrow table in write order.

    ``dedup`` keeps the first row per (entity_type, entity_id, run_id): a safeguard, since the writer
    never writes a key twice within a resumed run.
    """
    root = Location.of(store)
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


def done_keys(store: str | Path, key_columns: tuple[str, ...] = KEY_COLUMNS) -> set[tuple[str, ...]]:
    """Keys (by default (entity_type, entity_id) pairs) already written to ``store``: what a resumed run skips."""
    root = Location.of(store)
    manifest = scan_store(root)
    keys: set[tuple[str, ...]] = set()
    for shard in manifest.shards:
        try:
            t = read_shard(root, shard, columns=list(key_columns))
        except CorruptShardError as exc:  # not done: its entities are generated again
            log.error("%s", exc)
            continue
        keys.update(zip(*(t.column(c).to_pylist() for c in key_columns)))
    return keys


# what failures.jsonl lines may carry besides FAILURE_COLUMNS (absent in lines written before them: null):
# the inputs' source_hash and the generation config's hash of a failure; given_up and count on the line that
# records a scheduled run giving up on an entity after ``count`` identical failures
FAILURE_FIELDS = {**{c: pl.Utf8 for c in FAILURE_COLUMNS}, "source_hash": pl.Utf8, "config_hash": pl.Utf8,
                  "given_up": pl.Boolean, "count": pl.Int64}


def append_failures(store: str | Path | Location, records: list[dict[str, Any]]) -> None:
    """Append failure records (JSON lines) to ``store``'s failures.jsonl, fsynced; under the output's lock."""
    if not records:
        return
    data = "".join(json.dumps(r) + "\n" for r in records)
    check_held()
    path = Location.of(store) / FAILURES
    if path.local:
        with open(path.local_path, "a", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    else:  # no appends on object stores: the whole (small) file is put again
        path.write_bytes((path.read_bytes() if path.exists() else b"") + data.encode())


def read_failures(store: str | Path, unresolved: bool = True, every_line: bool = False) -> pl.DataFrame:
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


def knowledge_texts(store: str | Path, entity_type: str | None = None) -> dict[tuple[str, str], str]:
    """{(entity_type, entity_id): knowledge} over a store; the input pools are built from."""
    frame = read_knowledge(store)
    if entity_type is not None:
        frame = frame.filter(pl.col("entity_type") == entity_type)
    return {(t, i): k for t, i, k in frame.select("entity_type", "entity_id", "knowledge").iter_rows()}

