"""The run ledger ``<output>/runs.parquet``: one row per run, rewritten atomically at start and finish
(temp file + rename locally, one whole-object put on an object store).

A run is ``running`` from its start until it finishes as ``succeeded``, ``partial`` (some entities
failed) or ``failed`` (an error stopped it); entities given up on after identical failures (``given_up``,
:mod:`pipelines.ops.schedule.failures`) are not decoded and leave a run ``succeeded``. A ``running`` row
whose run is gone (the driver was killed) is resumed by the next run of the same config: it keeps that
``run_id`` so rows already written count. The watermark is the newest interaction time (unix seconds) the
run saw; the next run reports what arrived after the last successful run's watermark.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.store.shards import parquet_bytes, utc_now
from pipelines.store.lock import check_held
from pipelines.store.location import Location

log = logging.getLogger(__name__)

LEDGER_FILE = "runs.parquet"
STATUSES = ("running", "succeeded", "partial", "failed")
_TS = pa.timestamp("us", tz="UTC")
_FIELDS: list[pa.Field] = [  # typed: the stubs' Field is invariant, so a mixed list would be list[object]
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("seq", pa.int64()),  # the run's place in this output's sequence (rows carry it as run_seq)
    pa.field("started", _TS, nullable=False),
    pa.field("finished", _TS),
    pa.field("status", pa.string(), nullable=False),
    pa.field("watermark", pa.int64()),  # newest interaction timestamp (unix s) this run saw
    pa.field("previous_watermark", pa.int64()),  # the last successful run's watermark
    pa.field("entities_new", pa.int64()),  # no knowledge yet
    pa.field("entities_changed", pa.int64()),  # knowledge made from other inputs (source_hash differs)
    pa.field("entities_unchanged", pa.int64()),  # kept their latest row
    pa.field("users_after_watermark", pa.int64()),  # users with interactions newer than previous_watermark
    pa.field("generated", pa.int64()),
    pa.field("failed", pa.int64()),
    pa.field("given_up", pa.int64()),  # entities not decoded: given up after identical failures (failures.py)
    pa.field("old_generated", pa.int64()),
    pa.field("old_failed", pa.int64()),
    pa.field("decoder", pa.string(), nullable=False),
    pa.field("config_hash", pa.string(), nullable=False),
    pa.field("error", pa.string()),
]
LEDGER_SCHEMA = pa.schema(_FIELDS)


@dataclass
class RunRecord:
    """One ledger row (see :data:`LEDGER_SCHEMA`)."""

    run_id: str
    decoder: str
    config_hash: str
    started: datetime = field(default_factory=utc_now)
    finished: datetime | None = None
    status: str = "running"
    watermark: int | None = None
    previous_watermark: int | None = None
    entities_new: int = 0
    entities_changed: int = 0
    entities_unchanged: int = 0
    users_after_watermark: int = 0
    generated: int = 0
    failed: int = 0
    given_up: int = 0
    old_generated: int = 0
    old_failed: int = 0
    error: str | None = None
    seq: int | None = None  # set by RunLedger.next_seq when the run starts; kept when it resumes


class RunLedger:
    """Read and update ``runs.parquet`` (call only while holding the output's run lock)."""

    def __init__(self, root: str | Path | Location) -> None:
        self.path = Location.of(root) / LEDGER_FILE

    def records(self) -> list[RunRecord]:
        if not self.path.exists():
            return []
        try:
            table = pq.read_table(pa.BufferReader(self.path.read_bytes()))
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{self.path}: unreadable run ledger ({exc}); move it aside to start a new one") from exc
        return [RunRecord(**row) for row in table.to_pylist()]

    def last_succeeded(self) -> RunRecord | None:
        """The newest run that finished (``succeeded`` or ``partial``): its watermark is the next run's base."""
        done = [r for r in self.records() if r.status in ("succeeded", "partial")]
        return done[-1] if done else None

    def unfinished(self, config_hash: str) -> RunRecord | None:
        """The newest ``running`` run of this config, if it is the last run: a killed run to resume."""
        recs = self.records()
        if recs and recs[-1].status == "running" and recs[-1].config_hash == config_hash:
            return recs[-1]
        return None

    def next_seq(self) -> int:
        """The sequence number of a run starting now: one past every run recorded (a ledger written before
        runs had numbers counts its rows)."""
        recs = self.records()
        return max([r.seq for r in recs if r.seq is not None] + [len(recs) - 1], default=-1) + 1

    def save(self, record: RunRecord) -> None:
        """Insert or replace ``record`` (by run_id), atomically."""
        check_held()
        recs = [r for r in self.records() if r.run_id != record.run_id] + [record]
        table = pa.Table.from_pylist([asdict(r) for r in recs], schema=LEDGER_SCHEMA)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(parquet_bytes(table))
        log.debug("%s: run %s %s", self.path, record.run_id, record.status)
