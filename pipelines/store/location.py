"""Where a job's durable files live: a local directory, or an fsspec URI (``s3://``, ``gs://``, ``hdfs://``,
``memory://``; ``file://`` is a local path).

A :class:`Location` is a filesystem plus a path on it, with the few operations the stores need. Every
write replaces one whole file atomically:

- **local**: a temp file in the same directory, fsync, ``os.replace``, fsync of the directory;
- **other filesystems**: one whole-object put. Object stores have no rename, but a put becomes visible
  whole or not at all, so readers never see a partial object. Multi-file commits are built on top of
  that by the knowledge store (unique shard names, then the manifest object last).

A URI whose filesystem is not installed (e.g. ``s3://`` without ``s3fs``) fails naming the URI and the
package to install.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from pathlib import Path
from typing import Any, Callable

import fsspec
from fsspec.implementations.local import LocalFileSystem

_LOCAL = LocalFileSystem()
HINTS = {
    "s3": "install s3fs (the s3 extra)",
    "s3a": "install s3fs (the s3 extra)",
    "gs": "install gcsfs",
    "gcs": "install gcsfs",
    "abfs": "install adlfs",
    "az": "install adlfs",
    "hdfs": "needs a JVM and libhdfs for pyarrow's HadoopFileSystem",
}


class StorageError(ValueError):
    """A path or URI that cannot be used as a store (names it and the fix)."""


def is_uri(path: Any) -> bool:
    """Whether ``path`` is a URI (``scheme://...``) rather than a local path."""
    return "://" in str(path)


def atomic_write_local(path: Path, write: Callable[[str], Any]) -> None:
    """Write ``path`` through a temp file in the same directory: ``write(tmp_path)``, fsync, rename.

    ``mkstemp`` creates the temp file 0600; it gets the umask-derived mode of a normal write instead.
    """
    from laser.files import file_mode  # here: importing the laser package loads torch, which `laser --help` never needs

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, file_mode())
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:  # a failed write (disk full) names no file: name it
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Location:
    """A file or directory on the local disk or on an fsspec filesystem."""

    __slots__ = ("fs", "path")

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path

    @classmethod
    def of(cls, target: "str | Path | Location") -> "Location":
        """``target`` as a Location: a local path, a ``file://`` URI (local) or another fsspec URI."""
        if isinstance(target, Location):
            return target
        text = str(target)
        if not is_uri(text):
            return cls(_LOCAL, str(Path(text)))
        try:
            fs, path = fsspec.core.url_to_fs(text)
        except (ImportError, ValueError, OSError) as exc:  # OSError: e.g. hdfs:// without a JVM and libhdfs
            scheme = text.split("://", 1)[0]
            hint = f"; {HINTS[scheme]}" if scheme in HINTS else ""
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StorageError(f"{text}: no usable filesystem for {scheme}:// ({reason}){hint}") from None
        return cls(_LOCAL, path) if isinstance(fs, LocalFileSystem) else cls(fs, path)

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def local_path(self) -> Path:
        """The local path (only for local locations)."""
        if not self.local:
            raise StorageError(f"{self}: not a local path")
        return Path(self.path)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> "Location":
        return Location(self.fs, posixpath.dirname(self.path.rstrip("/")) or "/")

    def __truediv__(self, name: str) -> "Location":
        if self.local:
            return Location(self.fs, str(Path(self.path) / name))
        return Location(self.fs, posixpath.join(self.path, name))

    def __str__(self) -> str:
        return self.path if self.local else self.fs.unstrip_protocol(self.path)

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __fspath__(self) -> str:  # local only: a remote location must never become a local path by accident
        return str(self.local_path)

    # ---- reading ----
    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted names of the entries directly under this directory matching ``pattern`` (glob)."""
        if not self.exists():
            return []
        found = (
            self.fs.glob(posixpath.join(self.path.rstrip("/"), pattern))
            if not self.local
            else [str(p) for p in Path(self.path).glob(pattern)]
        )
        return sorted(posixpath.basename(str(p).rstrip("/")) for p in found)

    # ---- writing ----
    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        if self.local:
            Path(self.path).mkdir(parents=parents, exist_ok=exist_ok)
        else:
            self.fs.makedirs(self.path, exist_ok=True)  # a no-op on object stores (no directories)

    def write_bytes(self, data: bytes) -> None:
        """Replace the file with ``data`` atomically (local: temp + fsync + rename; else one put)."""
        if self.local:
            atomic_write_local(Path(self.path), lambda tmp: Path(tmp).write_bytes(data))
        else:
            self.fs.pipe_file(self.path, data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def create(self, data: bytes) -> bool:
        """Create the file with ``data`` only if it does not exist (exclusive create; False if it did).

        Exclusive on local disks and fsspec's memory filesystem; on S3 a conditional put
        (``If-None-Match: *``, s3fs ``"xb"``). A filesystem without exclusive create raises StorageError.
        """
        try:
            with self.fs.open(self.path, "xb") as fh:
                fh.write(data)
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError) as exc:
            raise StorageError(
                f"{self}: this filesystem cannot create a file exclusively ({exc}); a run lock needs it"
            ) from exc
        return True

    def remove(self) -> None:
        """Delete the file; no error when it is already gone."""
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            pass

    def move_to(self, dest: "Location") -> None:
        """Move to ``dest`` (local: an atomic rename; elsewhere copy, then delete)."""
        if self.local:
            os.replace(self.path, dest.path)
        else:
            self.fs.mv(self.path, dest.path)
