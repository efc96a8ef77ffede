"""Atomic file writes for the layers under the pipeline (laser, pools, router): a file is either its old
version or its whole new one, never a partly written one. (The pipeline's own, with fsync and object stores,
is :func:`pipelines.store.location.atomic_write_local`.)"""

from __future__ import annotations

import os
import threading
import tempfile
from pathlib import Path
from typing import Callable


_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask, read without changing it where the kernel shows it (Linux: /proc/self/status);
    elsewhere set and restored under a lock, so no file this process makes meanwhile gets mode 0o666."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)  # the strictest mask for the instant it is out
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain ``open(..., "w")`` would give a new file under the process's umask."""
    return 0o666 & ~umask()


def atomic_write(path: str | Path, write: Callable[[str], object]) -> Path:
    """Write ``path`` through a temp file beside it (``write(temp_path)``, then a rename); the temp file never
    outlives a failure. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, file_mode())  # mkstemp makes 0600
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
