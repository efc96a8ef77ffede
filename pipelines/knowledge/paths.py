"""Where a job reads and writes: the stores, the summary, the ledger and the latest view under
``output.path`` (a local directory or an fsspec URI), the derived files in a local work directory."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import JobConfig
from pipelines.store.location import Location


@dataclass(frozen=True)
class JobPaths:
    """The job's locations. The stores, the summary, the ledger and the latest view live under ``root``;
    the derived files (routing, memberships, pools) under ``work``: ``root`` itself when it is local, else
    ``output.work_dir`` (see :func:`work_dir`)."""

    root: Location
    knowledge: Location
    old_knowledge: Location
    summary: Location
    work: Path
    routing: Path
    memberships: Path
    pools: Path

    @classmethod
    def of(cls, cfg: JobConfig) -> "JobPaths":
        root = Location.of(cfg.output.path)
        old = Location.of(cfg.old_knowledge.path) if cfg.old_knowledge.path else root / "old_knowledge"
        work = work_dir(cfg, root)
        return cls(
            root=root,
            knowledge=root / "knowledge",
            old_knowledge=old,
            summary=root / "summary.json",
            work=work,
            routing=work / "routing.parquet",
            memberships=work / "memberships.parquet",
            pools=work / "pools",
        )


def work_dir(cfg: JobConfig, root: Location) -> Path:
    """The local directory of the derived files: the output itself, ``output.work_dir``, or a cache folder
    named after the output URI."""
    if cfg.output.work_dir:
        return Path(cfg.output.work_dir)
    if root.local:
        return root.local_path
    from laser.models import cache_dir

    return cache_dir() / "work" / hashlib.sha256(str(root).encode()).hexdigest()[:16]
