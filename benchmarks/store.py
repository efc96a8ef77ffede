"""`laser bench store`: what the knowledge store costs as it grows (issue 47, "a store whose cost follows the rows
written").

For each size N a fresh store is written as a run writes it: N rows with short fake texts, through
:class:`KnowledgeWriter` in shards of 256 rows (the job's default), compaction and checkpoints on. Measured:

- **commit**: each shard's log entry put (seconds and bytes), against the old commit, a rewrite of the whole
  manifest: timed here at the number of shards the run ends with, in the old format (the run's total of old
  rewrites is their sum over s = 1..S shards, linear in s);
- the run's **checkpoints** and **compactions** (seconds, bytes, rows rewritten);
- **open**: a writer's open (no checksums) and the run's verifying open (every shard's sha256, cache cleared);
- **index**: :func:`read_index` cold (sha256 checked: a fresh process) and warm (checked already), against
  :func:`read_knowledge` (every text: what change detection read before);
- **latest**: :func:`latest_view` (newest row per entity from the index, then those rows' columns).

Prints a table and writes JSON (with the machine and its load).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pipelines.store import knowledge as kn, shards as ss
from pipelines.store.location import Location

log = logging.getLogger(__name__)

SIZES = (10_000, 100_000, 1_000_000)
SHARD_ROWS = 256


def fake_rows(n: int, run_id: str) -> Iterator[dict[str, Any]]:
    """``n`` knowledge rows with short texts; quality columns filled, so the writer computes none."""
    for i in range(n):
        yield {
            "entity_type": "user" if i % 2 else "item",
            "entity_id": f"e{i:08d}",
            "knowledge": f"Enjoys films like number {i % 997} and dislikes slow plots.",
            "model": "m",
            "decoder": "laser",
            "decoder_params": "{}",
            "prompt_version": "v1",
            "pool_kind": "attribute",
            "group_id": str(i % 64),
            "n_tokens": 12,
            "target_forwards": 6,
            "accepted_tokens": 6,
            "retrieval_s": 0.0,
            "generation_s": 0.1,
            "finish_reason": "eos",
            "run_id": run_id,
            "finished_eos": True,
            "repeat_4gram": 0.0,
            "degenerate": False,
            "greedy_retry": False,
            "ended": True,
            "cut": False,
            "fragment": False,
            "n_words": 10,
            "source_hash": f"s{i}",
            "config_hash": "c",
        }


@contextmanager
def _timed(name: str, spent: dict[str, list[float]], nbytes: dict[str, int]) -> Iterator[None]:
    """Time every call of ``ss.<name>`` (and count the bytes it writes) while the block runs."""
    real = getattr(ss, name)

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        out = real(*args)
        spent.setdefault(name, []).append(time.perf_counter() - start)
        if name == "_put_log_entry":
            nbytes[name] = nbytes.get(name, 0) + len(args[1])
        return out

    setattr(ss, name, timed)
    try:
        yield
    finally:
        setattr(ss, name, real)


def _old_manifest_body(shards: list[dict[str, Any]]) -> str:
    return json.dumps({"format": "laser-knowledge/1", "shards": shards}, indent=1)


def old_commit(store: Location, shards: list[dict[str, Any]], repeats: int = 5) -> dict[str, float]:
    """The old commit at ``len(shards)`` shards: the whole manifest rewritten atomically (median seconds, bytes),
    and the run's total of them (s = 1..S, linear in s, from the ends)."""
    scratch = store / "old-manifest.json"
    cost = {}
    for count in (1, len(shards)):
        body = _old_manifest_body(shards[:count])
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            scratch.write_text(body)
            times.append(time.perf_counter() - start)
        cost[count] = (sorted(times)[repeats // 2], len(body))
    scratch.remove()
    (t1, b1), (ts, bs) = cost[1], cost[len(shards)]
    s = len(shards)
    return {"commit_s": ts, "commit_bytes": bs, "run_s": s * (t1 + ts) / 2, "run_bytes": s * (b1 + bs) / 2}


def _clock(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_size(n: int, root: Path) -> dict[str, Any]:
    """Write ``n`` rows into a fresh store under ``root`` and measure it (module docstring)."""
    from pipelines.ops.schedule.latest import latest_view

    store = Location.of(root / f"store-{n}")
    spent: dict[str, list[float]] = {}
    nbytes: dict[str, int] = {}
    shards_written = -(-n // SHARD_ROWS)
    start = time.perf_counter()
    with (
        _timed("_put_log_entry", spent, nbytes),
        _timed("checkpoint", spent, nbytes),
        _timed("compact_shards", spent, nbytes),
    ):
        with kn.KnowledgeWriter(store, shard_rows=SHARD_ROWS, run_id="bench", run_seq=1) as writer:
            for row in fake_rows(n, "bench"):
                writer.add(row)
    write_s = time.perf_counter() - start
    commits = spent["_put_log_entry"]
    manifest = ss.Manifest.load(store)
    # the old writer's manifest at the end of the run: one entry per 256-row shard
    old_shards = [
        {"file": f"part-{i:05d}.parquet", "rows": SHARD_ROWS, "run_id": "bench", "sha256": "0" * 64}
        for i in range(shards_written)
    ]
    old = old_commit(store, old_shards)
    time.sleep(2.1)  # files older than the slack of the checksum cache (a store written by an earlier run)
    open_s, _ = _clock(lambda: ss.open_shards(store, verify=False))
    ss._VERIFIED.clear()
    verify_s, _ = _clock(lambda: ss.open_shards(store))
    ss._VERIFIED.clear()
    index_cold_s, index = _clock(lambda: kn.read_index(store))
    index_warm_s, _ = _clock(lambda: kn.read_index(store))
    full_s, full = _clock(lambda: kn.read_knowledge(store))
    latest_s, view = _clock(lambda: latest_view(store))
    assert index.height == full.height == view.height == n, (index.height, full.height, view.height, n)
    checkpoint_bytes = len((store / ss.MANIFEST).read_bytes())
    return {
        "rows": n,
        "shards_written": shards_written,
        "shards_after": len(manifest.shards),
        "write_s": write_s,
        "commits": len(commits),
        "commit_mean_ms": 1e3 * sum(commits) / len(commits),
        "commit_p99_ms": 1e3 * sorted(commits)[int(0.99 * (len(commits) - 1))],
        "commit_bytes_mean": nbytes["_put_log_entry"] / len(commits),
        "checkpoints": len(spent.get("checkpoint", [])),
        "checkpoint_s": sum(spent.get("checkpoint", [])),
        "checkpoint_bytes_last": checkpoint_bytes,
        "compactions": len(spent.get("compact_shards", [])),
        "compaction_s": sum(spent.get("compact_shards", [])),
        "old_commit_ms_at_end": 1e3 * old["commit_s"],
        "old_commit_bytes_at_end": old["commit_bytes"],
        "old_commits_run_s": old["run_s"],
        "old_commits_run_bytes": old["run_bytes"],
        "new_commits_run_s": sum(commits),
        "new_commits_run_bytes": nbytes["_put_log_entry"],
        "open_ms": 1e3 * open_s,
        "verify_open_s": verify_s,
        "index_cold_s": index_cold_s,
        "index_warm_s": index_warm_s,
        "read_knowledge_s": full_s,
        "latest_view_s": latest_s,
    }


WRITES = (
    ("rows", "rows", "{:,}"),
    ("shards", "shards_written", "{:,}"),
    ("after compaction", "shards_after", "{:,}"),
    ("write s", "write_s", "{:.1f}"),
    ("commit ms", "commit_mean_ms", "{:.2f}"),
    ("commit B", "commit_bytes_mean", "{:.0f}"),
    ("old commit ms at S", "old_commit_ms_at_end", "{:.2f}"),
    ("old commit kB at S", "old_commit_kb_at_end", "{:,.1f}"),
    ("run's commits s", "new_commits_run_s", "{:.2f}"),
    ("old: run's commits s", "old_commits_run_s", "{:.1f}"),
    ("run's commits MB", "new_commits_run_mb", "{:.2f}"),
    ("old: run's commits MB", "old_commits_run_mb", "{:,.1f}"),
    ("checkpoints s", "checkpoint_s", "{:.2f}"),
    ("compaction s", "compaction_s", "{:.1f}"),
)
READS = (
    ("rows", "rows", "{:,}"),
    ("writer open ms", "open_ms", "{:.1f}"),
    ("verifying open s", "verify_open_s", "{:.2f}"),
    ("index cold s", "index_cold_s", "{:.2f}"),
    ("index warm s", "index_warm_s", "{:.2f}"),
    ("read_knowledge s", "read_knowledge_s", "{:.2f}"),
    ("latest view s", "latest_view_s", "{:.2f}"),
)


def table(results: list[dict[str, Any]], columns: tuple = WRITES) -> str:
    """The results as a Markdown table of ``columns`` (title, key, format)."""
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---:|" * len(columns)]
    for r in results:
        derived = {
            "old_commit_kb_at_end": r["old_commit_bytes_at_end"] / 1e3,
            "new_commits_run_mb": r["new_commits_run_bytes"] / 1e6,
            "old_commits_run_mb": r["old_commits_run_bytes"] / 1e6,
        }
        lines.append("| " + " | ".join(fmt.format((r | derived)[key]) for _, key, fmt in columns) + " |")
    return "\n".join(lines)


def run_store_bench(json_out: Path, sizes: tuple[int, ...] = SIZES, work: Path | None = None) -> list[dict[str, Any]]:
    """Measure every size (module docstring); print the table, write the JSON. ``work``: where the stores go
    (a temporary folder by default, removed after)."""
    root = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="laser-bench-store-"))
    results = []
    try:
        for n in sizes:
            log.info("store bench: %d rows", n)
            results.append(bench_size(n, root))
            shutil.rmtree(root / f"store-{n}", ignore_errors=True)
            print(table(results[-1:]), "\n", table(results[-1:], READS), flush=True)
    finally:
        if work is None:
            shutil.rmtree(root, ignore_errors=True)
    report = {
        "bench": "store",
        "shard_rows": SHARD_ROWS,
        "checkpoint_min": ss.CHECKPOINT_MIN,
        "compact_after": ss.COMPACT_AFTER,
        "compact_rows": ss.COMPACT_ROWS,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=1))
    print(table(results), "\n", table(results, READS), sep="\n")
    return results
