"""One run at a time per output: ``<output>/.run.lock``.

**Local output**: an exclusive ``flock`` on the file. The kernel drops a ``flock`` when its holder dies,
so a lock left by a killed run is never blocking: the next run acquires it and finds the dead holder's
record (pid, host, run start) still in the file, logs it as a stale lock taken over, and overwrites it.
A clean release empties the file. ``flock`` needs a local file system (or NFSv4 with lock support).

**Output on an fsspec URI** (object stores: no ``flock``): a *lease object*. The lock is the object
``.run.lock``, created with an exclusive create (S3: a conditional put, ``If-None-Match: *``; fsspec's
memory and local filesystems: ``"xb"``), holding the holder's record, a random token and an expiry
time. The holder renews the expiry every ``lease_s / 3`` seconds from a background thread and deletes
the object on release. A second run finds the object and exits with the lock code while the lease is
unexpired. Nothing tells a dead holder from a slow one, so a killed run's lease blocks the output until
it expires (``lease_s``, default 15 min); then the next run deletes it and creates its own. Limits:
two runs that find the *same expired* lease at the same instant can both take it over (the window is
between the delete and the create; the loser's next renewal sees the other token and logs an error);
a holder paused longer than its lease (e.g. a suspended VM) can lose the lock without noticing until
its next renewal. A filesystem without exclusive create cannot hold this lock and is refused.

A lease that cannot be renewed (taken over, or not confirmed before it would expire) is **lost**: every
write of the stores calls :func:`check_held` first, which raises :class:`LockLost`, so the run stops
before its next write. The local lock file is opened without following a symbolic link and must be a
regular file; its contents are never logged, only the record fields (pid, host, run_id, started).

:func:`output_lock` is the one call every writer makes (run, incremental, latest, encode, ingest): it
is reentrant within a process, so a command that holds the lock can call another writer.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pipelines.store.location import Location

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
LEASE_S = 900.0  # lease of a lock object on an object store
RECORD_KEYS = ("pid", "host", "run_id", "started", "expires")  # the only fields ever shown or logged
_HELD: dict[str, "RunLock"] = {}  # locks this process holds through output_lock, by lock path
_LEASES: set["RunLock"] = set()  # lease locks this process holds (checked before every store write)


class LockError(ValueError):
    """The lock file cannot be used safely (a symbolic link, not a regular file)."""


class LockLost(RuntimeError):
    """This run's lease on an object store was taken over or could not be renewed in time."""


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is its record (pid, host, started, run_id)."""

    def __init__(self, path: Path | Location, holder: dict[str, Any]) -> None:
        self.path, self.holder = path, holder
        who = ", ".join(f"{k}={v}" for k, v in _shown(holder).items()) or "unknown holder"
        super().__init__(f"{path}: another run holds this output's lock ({who}); not starting")


class RunLock:
    """Context manager holding the output's run lock; ``stale`` is the record of a dead holder (local) or
    an expired lease (object store) that was taken over (None when the lock was free)."""

    def __init__(self, root: str | Path | Location, run_id: str = "", lease_s: float = LEASE_S) -> None:
        self.location = Location.of(root) / LOCK_FILE
        self.path = self.location.local_path if self.location.local else self.location
        self.run_id, self.lease_s = run_id, lease_s
        self.stale: dict[str, Any] | None = None
        self._fd: int | None = None
        self._lease: _Lease | None = None

    def _record(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "run_id": self.run_id,
            "started": datetime.now(timezone.utc).isoformat(),
        }

    def acquire(self) -> "RunLock":
        if not self.location.local:
            self._lease = _Lease(self.location, self._record(), self.lease_s)
            self.stale = self._lease.acquire()
            _LEASES.add(self)
            return self
        path = self.location.local_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd)
            os.close(fd)
            raise LockHeld(path, holder) from None
        previous = _read_record(fd)
        if previous:
            self.stale = previous
            log.warning(
                "%s: took over a stale lock from a run that did not release it: %s",
                path,
                _shown(previous) or "(not a lock record)",
            )
        _write_record(fd, self._record(), path)
        self._fd = fd
        _clear_temp_files(path.parent)
        return self

    def check(self) -> None:
        """Raise :class:`LockLost` when this lock's lease was lost (local locks cannot be lost)."""
        if self._lease is not None and self._lease.lost.is_set():
            raise LockLost(
                f"{self.location}: this run lost its lease on the output ({self._lease.why}); "
                "stopped before writing more"
            )

    def release(self) -> None:
        if self._lease is not None:
            _LEASES.discard(self)
            self._lease.release()
            self._lease = None
        if self._fd is None:
            return
        _write_record(self._fd, None, self.location.local_path)  # empty = released cleanly
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Lease:
    """The lock object on a filesystem without ``flock`` (see the module doc)."""

    def __init__(self, path: Location, record: dict[str, Any], lease_s: float) -> None:
        self.path, self.lease_s = path, lease_s
        self.record = {**record, "token": uuid.uuid4().hex}
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.why = ""
        self._confirmed = time.monotonic()  # when the lease was last known to be ours
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        expires = datetime.now(timezone.utc) + timedelta(seconds=self.lease_s)
        return json.dumps({**self.record, "expires": expires.isoformat()}).encode()

    def _holder(self) -> dict[str, Any]:
        try:
            return _parse(self.path.read_bytes())
        except FileNotFoundError:
            return {}

    def acquire(self) -> dict[str, Any] | None:
        """Create the lock object; take over an expired one (returned). Raises LockHeld."""
        stale = None
        if not self.path.create(self._body()):
            holder = self._holder()
            if not _expired(holder):
                raise LockHeld(self.path, holder)
            log.warning("%s: took over an expired lease of a run that did not release it: %s", self.path, holder)
            stale = holder
            self.path.remove()
            if not self.path.create(self._body()):  # another run took it over first
                raise LockHeld(self.path, self._holder())
        self._thread = threading.Thread(target=self._renew, name="laser-lock-lease", daemon=True)
        self._thread.start()
        return stale

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if not self.renew_once():
                return

    def renew_once(self) -> bool:
        """Extend the lease if it is still this run's: check the token, put, read back the token. Returns
        False once the lease is lost (taken over, or unconfirmed for 2/3 of the lease: it may expire)."""
        try:
            if self._holder().get("token") != self.record["token"]:
                return self._lose("taken over by another run")
            self.path.write_bytes(self._body())
            if self._holder().get("token") != self.record["token"]:  # another run's put landed with ours
                return self._lose("taken over by another run")
            self._confirmed = time.monotonic()
        except OSError as exc:  # transient: retried while the lease can still be trusted
            if time.monotonic() - self._confirmed > self.lease_s * 2 / 3:
                return self._lose(f"not renewed in time: {exc}")
            log.warning("%s: could not renew the lease (%s); retrying", self.path, exc)
        return True

    def _lose(self, why: str) -> bool:
        self.why = why
        self.lost.set()
        log.error("%s: this run's lease is lost (%s); the run stops before its next write", self.path, why)
        return False

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._holder().get("token") == self.record["token"]:
            self.path.remove()


def _expired(holder: dict[str, Any]) -> bool:
    """Whether a lease record's expiry has passed (an unreadable record counts as expired)."""
    try:
        return datetime.fromisoformat(holder["expires"]) < datetime.now(timezone.utc)
    except (KeyError, TypeError, ValueError):
        return True


def _parse(raw: bytes) -> dict[str, Any]:
    """A lock record; anything that is not one is {"unreadable": True} (its bytes are never kept)."""
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        return dict(json.loads(text))
    except (json.JSONDecodeError, TypeError, ValueError):
        return {"unreadable": True}


def _shown(record: dict[str, Any]) -> dict[str, Any]:
    """The record fields that may be shown: pid, host, run_id, started, expires (short values only)."""
    return {k: str(record[k])[:80] for k in RECORD_KEYS if k in record}


def _clear_temp_files(root: Path) -> None:
    """Remove the temp files (``.<name>.*.tmp``) that a killed holder's atomic writes (ledger, latest view,
    summary) left in the output folder: only a lock holder writes there."""
    stale = [p for p in root.glob(".*.tmp") if p.is_file() and not p.is_symlink()]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        log.warning("%s: removed %d temp files left by a run that did not finish", root, len(stale))


def _open_lock_file(path: Path) -> int:
    """Open (create) the lock file without following a symbolic link; it must be a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(f"{path}: the run lock is a symbolic link; refusing to follow it (remove it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockError(f"{path}: the run lock is not a regular file; remove it")
    return fd


@contextmanager
def output_lock(root: str | Path | Location, run_id: str = "") -> Iterator[RunLock]:
    """Hold the output's run lock for the block; reentrant within a process (a nested writer reuses it).
    Raises :class:`LockHeld` when another process holds it."""
    key = str(Location.of(root) / LOCK_FILE)
    if key in _HELD:
        yield _HELD[key]
        return
    lock = RunLock(root, run_id=run_id).acquire()
    _HELD[key] = lock
    try:
        yield lock
    finally:
        del _HELD[key]
        lock.release()


def check_held() -> None:
    """Before a store write: raise :class:`LockLost` if a lease this process holds was lost."""
    for lock in list(_LEASES):
        lock.check()


def _read_record(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse(os.read(fd, 65536))


def _write_record(fd: int, record: dict[str, Any] | None, path: Path) -> None:
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        if record:
            os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    except OSError as exc:  # e.g. a full disk: name the lock file
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
