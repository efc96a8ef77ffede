"""Persisting retrieval pools to a directory and loading them back lazily, one group at a time.

Layout::

    <dir>/manifest.json      {"format_version", "tokenizer": {"name", "vocab_sha256"}, "meta", "members",
                              "pools": {key: {"file", "offset", "n_texts", "n_tokens", "sha256"}}}
    <dir>/part-<id>.arrow    the texts of several pools (one build task's): a single column
                             ``token_ids: list<int32>``, each pool's texts rows ``offset`` .. ``offset + n_texts``
    <dir>/part-<id>-<n>.trie.arrow  a pool's snapshot, when asked for: the built trie as plain integers (one
                             ``state: int64`` column, pygtrie's node encoding: navigation commands, token steps
                             and counts, depth-first), the pool's settings in the schema metadata
    <dir>/members-<id>.parquet  which entity's text each pool holds (pool_key, entity_type, entity_id,
                             text_hash): what the next build compares to reuse pools whose texts did not change

The token-id texts are the canonical content (readable by any Arrow tool, independent of the trie
code). ``get`` loads the snapshot when there is one and builds the trie from the texts otherwise (where the
pool is used: the worker that drafts from it); ``laser bench pools`` measures both paths. Every file is plain
data (Arrow IPC, Parquet, JSON): nothing in a pool store is unpickled, so a tampered store can give poor drafts
but never run code. Files are written under new names, then the manifest atomically (temp file + rename):
a reader sees either the old or the new store, and a build killed midway leaves the old one whole. Each
commit numbers its manifest (``generation``) and removes the files that neither it nor the manifest it
replaces names: a reader that opened the previous generation (a vLLM server) still finds every file it
names, and :meth:`PoolStore.changed` tells it to reopen. Stores of format 1 (one file per pool) are not
read: the next build replaces them.

A store is read as untrusted input (a server opens the stores its clients name): the manifest's shape is
checked at open, every file it names must be a plain name of a regular file inside the store (no path, no
link out of it, no device), and anything wrong is a :class:`PoolStoreError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from laser.files import atomic_write
from pools.build import materialize
from pools.trie import TokenTrie
from pools.retrieval import RetrievalPool

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_COLUMN = "token_ids"
SNAPSHOT_SUFFIX = ".trie.arrow"
_POOL_SETTINGS = ("max_depth", "min_fraction", "max_trie_nodes", "texts")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # what a manifest may name: a file of the store
_FILE_KEYS = ("file", "snapshot")  # the file names of a manifest entry


class PoolStoreError(ValueError):
    """A pool store that cannot be used as asked: wrong format, other tokenizer, unknown key."""


@dataclass(frozen=True)
class TokenizerFingerprint:
    """Which tokenizer produced the token ids: its name and a checksum of its vocabulary."""

    name: str
    vocab_sha256: str

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerFingerprint:
        """Fingerprint a Hugging Face tokenizer (name_or_path + sha256 of the sorted vocabulary)."""
        vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode()
        return cls(
            str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__), hashlib.sha256(vocab).hexdigest()
        )


def _to_arrow(texts: Sequence[Sequence[int]]) -> pa.Table:
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int32, count=len(texts))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    values = np.fromiter((tok for t in texts for tok in t), dtype=np.int32, count=int(offsets[-1]))
    return pa.table({_COLUMN: pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))})


def write_part(
    directory: str | Path, pools: Sequence[tuple[str, Sequence[Sequence[int]]]], snapshot: bool = False
) -> dict[str, dict[str, Any]]:
    """Write the texts of ``pools`` ((key, token-id texts) pairs) as one part file under a new name (and, with
    ``snapshot``, each pool's built trie); returns their manifest entries. Nothing is visible before
    :func:`commit_store` names them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name, tables, offset = f"part-{uuid.uuid4().hex[:12]}.arrow", [], 0
    entries: dict[str, dict[str, Any]] = {}  # manifest entries (JSON)
    for key, texts in pools:
        if not texts:
            raise PoolStoreError(f"pool {key!r} is empty; empty groups get no pool (see PoolSources.empty_groups)")
        tables.append(_to_arrow(texts))
        entries[key] = {"file": name, "offset": offset, "n_texts": len(texts), "n_tokens": sum(len(t) for t in texts)}
        offset += len(texts)
    if not entries:
        return {}
    table = pa.concat_tables(tables)

    def write(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    atomic_write(directory / name, write)
    digest = _sha256(directory / name)
    for n, (key, texts) in enumerate(pools):
        entries[key]["sha256"] = digest
        if snapshot:
            entries[key]["snapshot"] = name.replace(".arrow", f"-{n}{SNAPSHOT_SUFFIX}")
            atomic_write(directory / entries[key]["snapshot"], partial(_write_snapshot, pool=materialize(texts)))
            entries[key]["snapshot_sha256"] = _sha256(directory / entries[key]["snapshot"])
    return entries


def commit_store(
    directory: str | Path,
    entries: Mapping[str, Mapping[str, Any]],
    tokenizer: TokenizerFingerprint,
    meta: Mapping[str, Any] | None = None,
    members: pa.Table | None = None,
) -> PoolStore:
    """Name ``entries`` (from :func:`write_part`, this build's or kept from the last) in a new manifest, with
    the ``members`` table of this build; then remove the files no entry names."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    previous = _previous_manifest(directory)
    members_file = None
    if members is not None:
        members_file = f"members-{uuid.uuid4().hex[:12]}.parquet"
        atomic_write(directory / members_file, lambda tmp: pq.write_table(members, tmp))
    manifest = {
        "format_version": FORMAT_VERSION,
        "generation": int(previous.get("generation", 0)) + 1,
        "tokenizer": asdict(tokenizer),
        "meta": dict(meta or {}),
        "members": members_file,
        "pools": {key: dict(entries[key]) for key in sorted(entries)},
    }
    atomic_write(directory / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1)))
    keep = _named_files(manifest) | _named_files(previous)  # a reader of the previous generation still finds its files
    for stale in [*directory.glob("p*-*.arrow"), *directory.glob("pool-*.pkl"), *directory.glob("members-*.parquet")]:
        if stale.name not in keep:  # this store's earlier files (and format 1's pool-*.arrow, .pkl)
            stale.unlink()
    log.info("wrote %d pools to %s", len(entries), directory)
    return PoolStore(directory, manifest, _signature(directory / MANIFEST))


def _named_files(manifest: Mapping[str, Any]) -> set[str]:
    """The files a manifest names."""
    pools = manifest.get("pools") or {}
    named = {e.get(f) for e in pools.values() if isinstance(e, dict) for f in _FILE_KEYS}
    return {n for n in named | {manifest.get("members")} if isinstance(n, str)}


def _previous_manifest(directory: Path) -> dict[str, Any]:
    """The manifest a commit replaces ({} when there is none or it is unreadable: nothing of it is kept)."""
    try:
        return _checked_manifest(directory / MANIFEST, (directory / MANIFEST).read_bytes())
    except (OSError, PoolStoreError):
        return {}


def _checked_manifest(path: Path, raw: bytes) -> dict[str, Any]:
    """The manifest in ``raw``, its shape checked: a :class:`PoolStoreError` naming ``path`` otherwise."""
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PoolStoreError(f"{path}: not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise PoolStoreError(f"{path}: a JSON object expected, got {type(manifest).__name__}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PoolStoreError(
            f"{path}: format version {manifest.get('format_version')!r}, this code reads version {FORMAT_VERSION}"
        )
    tok, pools = manifest.get("tokenizer"), manifest.get("pools")
    if not (isinstance(tok, dict) and isinstance(tok.get("name"), str) and isinstance(tok.get("vocab_sha256"), str)):
        raise PoolStoreError(f"{path}: 'tokenizer' must be {{'name': str, 'vocab_sha256': str}}")
    if not isinstance(pools, dict):
        raise PoolStoreError(f"{path}: 'pools' must be an object of pool entries")
    if not isinstance(manifest.get("generation", 0), int):
        raise PoolStoreError(f"{path}: 'generation' must be an integer")
    for key, entry in pools.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("n_texts"), int) or entry["n_texts"] < 0:
            raise PoolStoreError(f"{path}: pool {key!r}: an entry with an integer 'n_texts' expected")
        if not isinstance(entry.get("offset", 0), int) or entry.get("offset", 0) < 0:
            raise PoolStoreError(f"{path}: pool {key!r}: 'offset' must be an integer >= 0")
        for name in [entry.get("file")] + [entry[k] for k in _FILE_KEYS[1:] if entry.get(k) is not None]:
            _check_name(path, name, f"pool {key!r}")
    if manifest.get("members") is not None:
        _check_name(path, manifest["members"], "members")
    return manifest


def _check_name(path: Path, name: object, what: str) -> None:
    """A file a manifest names is a plain file name of the store (never a path)."""
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or ".." in name:
        raise PoolStoreError(f"{path}: {what} names {str(name)[:80]!r}, not a file of the store")


def _inside(directory: Path, name: str) -> Path:
    """The regular file ``name`` of the store at ``directory``: a link out of the store, a device or a folder
    is a :class:`PoolStoreError`."""
    path = directory / name
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(directory))
    if real.parent != root:
        raise PoolStoreError(f"{path}: links out of the pool store")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise PoolStoreError(f"{path}: missing (the store was rebuilt or damaged)") from None
    if not stat.S_ISREG(mode):
        raise PoolStoreError(f"{path}: not a regular file")
    return path


def write_store(
    directory: str | Path,
    texts: Mapping[str, Sequence[Sequence[int]]],
    tokenizer: TokenizerFingerprint,
    meta: Mapping[str, Any] | None = None,
    snapshot: bool = True,
) -> PoolStore:
    """Persist ``texts`` (pool key -> token-id texts, e.g. ``PoolSources.texts``) under ``directory``, in one
    part. With ``snapshot`` (default) each pool is also built and saved as plain integers, so that loading skips
    the trie build (a 2,000-text pool: about 0.5 s instead of 2.3 s on a 2-core CPU)."""
    entries = write_part(directory, [(key, texts[key]) for key in sorted(texts)], snapshot)
    return commit_store(directory, entries, tokenizer, meta)


def _write_snapshot(tmp: str, pool: RetrievalPool) -> None:
    """The pool's trie as one column of integers; its settings in the schema metadata."""
    settings = {"window": pool.trie.window, "nodes": len(pool.trie), **{k: getattr(pool, k) for k in _POOL_SETTINGS}}
    table = pa.table({"state": pool.trie.to_state()}).replace_schema_metadata({"laser_pool": json.dumps(settings)})
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _read_snapshot(path: Path) -> RetrievalPool:
    """A pool from its snapshot (plain integers; see :func:`_write_snapshot`)."""
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    settings = json.loads(table.schema.metadata[b"laser_pool"])
    pool = RetrievalPool(
        window=int(settings["window"]),
        max_depth=settings["max_depth"],
        min_fraction=settings["min_fraction"],
        max_trie_nodes=settings["max_trie_nodes"],
    )
    pool.trie = TokenTrie.from_state(
        pool.trie.window, int(settings["nodes"]), table.column("state").to_numpy().tolist()
    )
    pool.texts = int(settings["texts"])
    return pool


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _signature(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced: its inode, size and modification time."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class PoolStore:
    """A persisted set of pools; ``get(key)`` loads (and caches) one pool on first use."""

    def __init__(
        self, directory: Path, manifest: dict[str, Any], signature: tuple[int, int, int] | None = None
    ) -> None:
        self.directory = directory
        self.manifest = manifest
        self.signature = signature  # the manifest file's (inode, size, mtime) when read
        self._pools: dict[str, RetrievalPool] = {}
        self._verified: set[str] = set()  # part files whose checksum matched once

    @classmethod
    def open(cls, directory: str | Path, tokenizer: Any = None) -> PoolStore:
        """Open a store; ``tokenizer`` (a tokenizer or a :class:`TokenizerFingerprint`) must have the vocabulary
        of the one the pools were built with, else :class:`PoolStoreError`. Nothing is loaded yet."""
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.exists():
            raise PoolStoreError(f"{directory}: no pool store ({MANIFEST} missing)")
        signature = _signature(_inside(directory, MANIFEST))
        manifest = _checked_manifest(path, path.read_bytes())
        if tokenizer is not None:
            expected = tokenizer if isinstance(tokenizer, TokenizerFingerprint) else TokenizerFingerprint.of(tokenizer)
            stored = TokenizerFingerprint(**manifest["tokenizer"])
            if stored.vocab_sha256 != expected.vocab_sha256:  # the name may differ (another path to the model)
                raise PoolStoreError(
                    f"{directory}: pools were built with tokenizer {stored.name!r} "
                    f"(vocab sha256 {stored.vocab_sha256[:12]}), not {expected.name!r} "
                    f"(vocab sha256 {expected.vocab_sha256[:12]}); rebuild the pools"
                )
        return cls(directory, manifest, signature)

    @property
    def generation(self) -> int:
        """The number of the commit that wrote this manifest (0: a store from before generations)."""
        return int(self.manifest.get("generation", 0))

    def changed(self) -> bool:
        """Whether the store on disk is no longer the one opened (a new commit, or gone): reopen it."""
        try:
            return _signature(self.directory / MANIFEST) != self.signature
        except OSError:
            return True

    def keys(self) -> list[str]:
        return list(self.manifest["pools"])

    def __contains__(self, key: str) -> bool:
        return key in self.manifest["pools"]

    def sizes(self) -> dict[str, int]:
        """Texts per pool."""
        return {key: entry["n_texts"] for key, entry in self.manifest["pools"].items()}

    def token_ids(self, key: str) -> list[list[int]]:
        """The stored token-id texts of pool ``key``."""
        if key not in self:
            shown = ", ".join(self.keys()[:8])
            raise PoolStoreError(f"{self.directory}: no pool {key!r} (empty or unknown group); pools: {shown}")
        entry = self.manifest["pools"][key]
        path = self.check(key)
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all().slice(entry.get("offset", 0), entry["n_texts"])
            column = table.column(_COLUMN).combine_chunks()
            if not isinstance(column, (pa.ListArray, pa.LargeListArray)):
                raise PoolStoreError(f"{path}: column {_COLUMN!r} is {column.type}, not a list of token ids")
            values, offsets = column.values.to_numpy(), column.offsets.to_numpy()
            return [values[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]

    def check(self, key: str) -> Path:
        """The part file of pool ``key``, its checksum checked (once per file); :class:`PoolStoreError` when corrupt."""
        entry = self.manifest["pools"][key]
        path = _inside(self.directory, entry["file"])
        if entry["file"] not in self._verified:
            if entry.get("sha256") and _sha256(path) != entry["sha256"]:
                raise PoolStoreError(
                    f"{path}: checksum mismatch with {self.directory / MANIFEST}; the pool file is "
                    "corrupt: rebuild the pools (`laser build-pools`, or the next `laser run`)"
                )
            self._verified.add(entry["file"])
        return path

    def members(self) -> pa.Table | None:
        """Which entity's text each pool holds, as the build that wrote this store recorded it (or None)."""
        name = self.manifest.get("members")
        return pq.read_table(_inside(self.directory, name)) if name and (self.directory / name).exists() else None

    def get(self, key: str) -> RetrievalPool:
        """Pool ``key``, built from its stored texts on first use and cached."""
        if key not in self._pools:
            entry = self.manifest["pools"].get(key, {})
            snapshot = entry.get("snapshot")
            if snapshot and not snapshot.endswith(SNAPSHOT_SUFFIX):  # an older store's pickle: never loaded
                snapshot = None
            if (
                snapshot
                and entry.get("snapshot_sha256")
                and _sha256(_inside(self.directory, snapshot)) != entry["snapshot_sha256"]
            ):
                log.error(
                    "%s: snapshot checksum mismatch; rebuilding pool %r from its texts", self.directory / snapshot, key
                )
                snapshot = None
            if snapshot:
                try:
                    self._pools[key] = _read_snapshot(_inside(self.directory, snapshot))
                except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as exc:
                    log.error(
                        "%s: unreadable snapshot (%s); rebuilding pool %r from its texts",
                        self.directory / snapshot,
                        exc,
                        key,
                    )
                    snapshot = None
            if not snapshot:
                self._pools[key] = materialize(self.token_ids(key))
        return self._pools[key]

    def release(self, key: str) -> None:
        """Forget a cached pool (a worker that stops serving a group)."""
        self._pools.pop(key, None)


def open_store(directory: str | Path, tokenizer: Any = None) -> PoolStore:
    """Open the pool store at ``directory`` (the ``laser.pool_stores`` entry point: how the vLLM engine
    process opens pools by the path a request carries, without ``laser`` importing ``pools``)."""
    return PoolStore.open(directory, tokenizer=tokenizer)
