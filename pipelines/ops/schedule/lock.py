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
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pipelines.storage import Location

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
LEASE_S = 900.0  # lease of a lock object on an object store


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is its record (pid, host, started, run_id)."""

    def __init__(self, path: Path | Location, holder: dict[str, Any]) -> None:
        self.path, self.holder = path, holder
        who = ", ".join(f"{k}={v}" for k, v in holder.items()) or "unknown holder"
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
        return {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id,
                "started": datetime.now(timezone.utc).isoformat()}

    def acquire(self) -> "RunLock":
        if not self.location.local:
            self._lease = _Lease(self.location, self._record(), self.lease_s)
            self.stale = self._lease.acquire()
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd)
            os.close(fd)
            raise LockHeld(self.path, holder) from None
        previous = _read_record(fd)
        if previous:
            self.stale = previous
            log.warning("%s: took over a stale lock from a run that did not release it: %s", self.path, previous)
        _write_record(fd, self._record())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._fd is None:
            return
        _write_record(self._fd, None)  # empty = released cleanly
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
            try:
                if self._holder().get("token") != self.record["token"]:
                    log.error("%s: this run's lease was taken over by another run; it no longer holds the lock",
                              self.path)
                    return
                self.path.write_bytes(self._body())
            except OSError as exc:  # a transient store error: the next renewal (still within the lease) retries
                log.warning("%s: could not renew the lease (%s); retrying", self.path, exc)

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
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        return dict(json.loads(text))
    except (json.JSONDecodeError, TypeError, ValueError):
        return {"record": text[:200]}


def _read_record(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse(os.read(fd, 65536))


def _write_record(fd: int, record: dict[str, Any] | None) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    if record:
        os.write(fd, json.dumps(record).encode())
    os.fsync(fd)
