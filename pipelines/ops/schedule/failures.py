"""When a run stops retrying an entity: after ``generation.give_up_after`` identical failures in a row.

Every failure in ``failures.jsonl`` carries the entity, the reason, the ``source_hash`` of its prompt inputs
and the hash of the generation config (``config_hash``). Failures are identical when all four agree (the
reasons with their numbers and addresses masked: :func:`same_reason`); the
newest such run of lines is an entity's **streak**. A run's plan drops an entity whose streak has reached
``give_up_after`` and still matches today's inputs and config: it is not decoded again, and one line with
``given_up: true`` and the streak's ``count`` records why (once per streak). New inputs or another config
make a failure that starts a new streak, so the entity is tried again. 0 never gives up.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import polars as pl

from pipelines.store.shards import append_failures, read_failures, utc_now
from pipelines.store.location import Location

if TYPE_CHECKING:
    from pipelines.workers import GenerationRequest

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass(frozen=True)
class Streak:
    """An entity's newest run of identical failures: its reason, inputs and config, how many, the last run,
    and whether a give-up line already records it."""

    reason: str
    source_hash: str | None
    config_hash: str | None
    count: int
    last_run: str | None
    given_up: bool = False

    def matches(self, source_hash: str | None, config_hash: str | None) -> bool:
        return (self.source_hash, self.config_hash) == (source_hash, config_hash)


_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")  # addresses and numbers: they differ between runs


def same_reason(a: str | None, b: str | None) -> bool:
    """Two failure reasons are the same error when they agree with every number and address masked (an
    exception text that names a time, a size or an object's address still repeats)."""
    if a is None or b is None:
        return a == b
    return _VARYING.sub("#", a) == _VARYING.sub("#", b)


def streaks(lines: pl.DataFrame) -> dict[Key, Streak]:
    """Each entity's streak over failure lines in the order written (``read_failures(every_line=True)``)."""
    out: dict[Key, Streak] = {}
    for rec in lines.iter_rows(named=True):
        key = (rec["entity_type"], rec["entity_id"])
        prev = out.get(key)
        if rec["given_up"]:  # the record of a give-up, not a failure
            if prev is not None:
                out[key] = Streak(prev.reason, prev.source_hash, prev.config_hash, prev.count, prev.last_run, True)
            continue
        count = 1
        if (
            prev is not None
            and same_reason(prev.reason, rec["reason"])
            and prev.matches(rec["source_hash"], rec["config_hash"])
        ):
            count = prev.count + 1
        out[key] = Streak(rec["reason"], rec["source_hash"], rec["config_hash"], count, rec["run_id"])
    return out


def drop_given_up(
    todo: Sequence[GenerationRequest],
    store: str | Path | Location,
    give_up_after: int,
    config_hash: str | None,
    run_id: str = "",
) -> tuple[list[GenerationRequest], int]:
    """``todo`` without the entities given up on (see the module docstring), and how many were dropped;
    records each new give-up in ``store``'s failures.jsonl under ``run_id``. Call under the output's lock."""
    if give_up_after <= 0 or not todo:
        return list(todo), 0
    known = streaks(read_failures(store, unresolved=False, every_line=True))
    keep, dropped, records = [], [], []
    for req in todo:
        s = known.get((req.entity_type, req.entity_id))
        if s is None or s.count < give_up_after or not s.matches(req.source_hash, config_hash):
            keep.append(req)
            continue
        dropped.append(req)
        if not s.given_up:
            records.append(
                {
                    "entity_type": req.entity_type,
                    "entity_id": req.entity_id,
                    "reason": s.reason,
                    "run_id": run_id,
                    "failed_at": utc_now().isoformat(),
                    "source_hash": s.source_hash,
                    "config_hash": s.config_hash,
                    "given_up": True,
                    "count": s.count,
                }
            )
    append_failures(store, records)
    if dropped:
        names = ", ".join(f"{r.entity_type} {r.entity_id}" for r in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
        log.warning(
            "given up on %d entities after %d identical failures (%d newly; `laser failures CONFIG` lists them): %s",
            len(dropped),
            give_up_after,
            len(records),
            names,
        )
    return keep, len(dropped)


def failure_table(store: str | Path | Location) -> pl.DataFrame:
    """The entities with failures no later run resolved, one row each: entity_type, entity_id, status
    (``failed``: retried by the next run; ``given up``), reason, count (identical failures in a row),
    last_run (the run of the newest failure)."""
    lines = read_failures(store, unresolved=True, every_line=True)
    rows = [
        {
            "entity_type": t,
            "entity_id": i,
            "status": "given up" if s.given_up else "failed",
            "reason": s.reason,
            "count": s.count,
            "last_run": s.last_run,
        }
        for (t, i), s in streaks(lines).items()
    ]
    schema = {
        "entity_type": pl.Utf8,
        "entity_id": pl.Utf8,
        "status": pl.Utf8,
        "reason": pl.Utf8,
        "count": pl.Int64,
        "last_run": pl.Utf8,
    }
    return pl.DataFrame(rows, schema=schema).sort("status", "entity_type", "entity_id")
