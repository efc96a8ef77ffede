"""kill -9 of a knowledge-store writer between a shard and its log entry, and at each step of a compaction:
readers see every row once, the next writer clears what the crash left, a resumed run loses and doubles
nothing (issue 47; the job-level kill -9 per write phase is in tests/e2e/test_faults.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.store import knowledge as kn, shards as ss
from tests.helpers import knowledge_row as row

REPO = Path(__file__).resolve().parents[2]

# The child writes (or compacts) ``store`` and SIGKILLs itself at one step: ``hook`` names the function it
# wraps, ``match`` a part of the path the step writes or deletes, ``nth`` which such call dies (atomic writes:
# after the temp file is written whole; log lines: before the line, or after half of it).
CHILD = """
import os, signal, sys
from pathlib import Path
import pipelines.store.location as storage, pipelines.store.shards as ss
import pipelines.store.knowledge as kn
from tests.helpers import knowledge_row as row
store, action, hook, match, nth = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
seen = [0]
def due(path):
    if match in str(path):
        seen[0] += 1
        return seen[0] == nth
    return False
if hook == "atomic_write_local":
    real = storage.atomic_write_local
    def crashing(path, write):
        if due(path):
            write(str(Path(path).parent / f".{Path(path).name}.crash.tmp"))
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, write)
    storage.atomic_write_local = ss.atomic_write_local = crashing
elif hook in ("put_log", "cut_log"):  # killed before the log line, or half way through writing it
    real_put = ss._put_log_entry
    def dying_put(path, data):
        if due(path):
            if hook == "cut_log":
                real_put(path, data[:len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return real_put(path, data)
    ss._put_log_entry = dying_put
elif hook == "remove":
    real_rm = storage.Location.remove
    def dying_rm(self):
        if due(self):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rm(self)
    storage.Location.remove = dying_rm
if action == "write":
    with kn.KnowledgeWriter(store, shard_rows=2, run_id="r1", compact_after=None) as w:
        for i in range(10):
            w.add(row(i))
else:
    ss.compact_store(store, kn.KNOWLEDGE_SCHEMA, target_rows=16)
"""

WRITE = {
    "shard renamed, log entry not written": ("put_log", "/log/", 3),
    "log line half written": ("cut_log", "/log/", 3),
}
COMPACT = {
    "merged shard half written": ("atomic_write_local", "-c-", 1),
    "merged shard written, not committed": ("put_log", "/log/", 1),
    "committed, no replaced shard deleted": ("remove", "part-", 1),
    "committed, replaced shards half deleted": ("remove", "part-", 2),
}


def _kill(store: Path, action: str, hook: str, match: str, nth: int) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(store), action, hook, match, str(nth)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]


def _ids(store: Path) -> list[str]:
    return sorted(kn.read_knowledge(store, dedup=False)["entity_id"])


def _clean(store: Path) -> None:
    """Only committed shards are left, no temp file, nothing in the log after the writer's checkpoint."""
    committed = {s["file"] for s in ss.Manifest.load(store).shards}
    assert {p.name for p in store.glob("part-*.parquet")} == committed
    assert not list(store.rglob("*.tmp")) and not list((store / "log").glob("*"))


@pytest.mark.parametrize("step", list(WRITE))
def test_kill_9_between_a_shard_and_its_log_entry_loses_and_doubles_nothing(tmp_path, step):
    store = tmp_path / "k"
    _kill(store, "write", *WRITE[step])
    assert (store / "part-00002.parquet").exists() and len(ss.Manifest.load(store).shards) == 2
    assert _ids(store) == sorted(f"u{i}" for i in range(6))  # the renamed shard is read (local: complete)
    done = ss.done_keys(store)
    with kn.KnowledgeWriter(store, shard_rows=2, run_id="r1") as w:  # the resumed run: the rest
        for i in range(10):
            if ("user", f"u{i}") not in done:
                w.add(row(i))
    assert _ids(store) == sorted(f"u{i}" for i in range(10))
    _clean(store)


@pytest.mark.parametrize("step", list(COMPACT))
def test_kill_9_during_compaction_loses_and_doubles_nothing(tmp_path, step):
    store = tmp_path / "k"
    with kn.KnowledgeWriter(store, shard_rows=2, run_id="r1", compact_after=None) as w:
        for i in range(12):
            w.add(row(i))
    before = kn.read_knowledge(store, dedup=False)
    _kill(store, "compact", *COMPACT[step])
    assert kn.read_knowledge(store, dedup=False).equals(before)  # readers: every row once, in order
    assert len(ss.done_keys(store)) == 12
    kn.KnowledgeWriter(store).close()  # the next writer clears what the kill left
    _clean(store)
    assert kn.read_knowledge(store, dedup=False).equals(before)
    ss.compact_store(store, kn.KNOWLEDGE_SCHEMA, target_rows=16)  # and compaction goes on from there
    assert kn.read_knowledge(store, dedup=False).equals(before)
    _clean(store)
