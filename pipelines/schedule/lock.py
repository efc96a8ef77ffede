"""One run at a time per output directory: an exclusive ``flock`` on ``<output>/.run.lock``.

The kernel drops a ``flock`` when its holder dies, so a lock left by a killed run is never blocking: the
next run acquires it and finds the dead holder's record (pid, host, run start) still in the file, logs
it as a stale lock taken over, and overwrites it. A clean release empties the file. ``flock`` needs a
local file system (or NFSv4 with lock support); object stores cannot hold this lock.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is its record (pid, host, started, run_id)."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        self.path, self.holder = path, holder
        who = ", ".join(f"{k}={v}" for k, v in holder.items()) or "unknown holder"
        super().__init__(f"{path}: another run holds this output's lock ({who}); not starting")


class RunLock:
    """Context manager holding the output directory's run lock; ``stale`` is the record of a dead holder
    whose lock was taken over (None when the lock was free)."""

    def __init__(self, root: str | Path, run_id: str = "") -> None:
        self.path = Path(root) / LOCK_FILE
        self.run_id = run_id
        self.stale: dict[str, Any] | None = None
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
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
        record = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id,
                  "started": datetime.now(timezone.utc).isoformat()}
        _write_record(fd, record)
        self._fd = fd
        return self

    def release(self) -> None:
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


def _read_record(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536).decode("utf-8", "replace").strip()
    if not raw:
        return {}
    try:
        return dict(json.loads(raw))
    except (json.JSONDecodeError, TypeError, ValueError):
        return {"record": raw[:200]}


def _write_record(fd: int, record: dict[str, Any] | None) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    if record:
        os.write(fd, json.dumps(record).encode())
    os.fsync(fd)
