"""Faults, each for real: a Ray worker process killed mid-batch, a driver killed mid-run then resumed while a
second run is refused by the lock, a write failing part-way (disk full, simulated)."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipelines.workers import GenerationRequest
from pipelines.store.knowledge import KnowledgeWriter, read_knowledge
from pipelines.ops.schedule import exitcodes
from pipelines.knowledge.job import run_job
from pipelines.ops.schedule.ledger import RunLedger
from tests.helpers import check_killed_actor_loses_no_row
from test_schedule_incremental import incremental_config, write_table_data


def run_incremental(cfg):
    """One incremental run; its ledger row."""
    return run_job(cfg, incremental=True).record


pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LASER = [sys.executable, "-c", "from jobs.cli import app; app(prog_name='laser')"]


def test_worker_killed_mid_batch_is_restarted_and_its_batch_retried(tiny_model, ray_session, tmp_path):
    requests = [GenerationRequest("user", f"u{i:02d}", history=[(f"Film {i}", 4.0), ("Heat", 3.0)]) for i in range(48)]
    check_killed_actor_loses_no_row("hf", tiny_model, 2, requests, tmp_path / "knowledge")


def _lock_record(out: Path) -> str:
    path = out / ".run.lock"
    return path.read_text() if path.exists() else ""


def test_concurrent_run_refused_then_killed_driver_resumes(tiny_model, ray_session, tmp_path):
    data = write_table_data(tmp_path / "data")
    out = tmp_path / "job"
    cfg = incremental_config(
        tiny_model,
        data,
        out,
        "generation.max_new_tokens=600",
        "old_knowledge.max_new_tokens=8",
        "output.shard_rows=1",
        "execution.batch_size=1",
        f"execution.address={ray_session}",
    )
    config_file = tmp_path / "job.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    first = subprocess.Popen(
        [*LASER, "run", str(config_file), "--incremental"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = out / "knowledge"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and f"{first.pid}" not in _lock_record(out):
            time.sleep(0.02)
        second = subprocess.run(
            [*LASER, "run", str(config_file), "--incremental"], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == exitcodes.LOCKED, second.stderr
        assert f"pid={first.pid}" in second.stderr
        while time.time() < deadline and len(list(store.glob("part-*.parquet"))) < 3:
            time.sleep(0.02)
        assert first.poll() is None, "the first run ended before it could be killed"
    finally:
        first.send_signal(signal.SIGKILL)  # the driver dies mid-run
        first.wait()
    written = read_knowledge(store, dedup=False)
    [killed] = RunLedger(out).records()
    assert killed.status == "running" and 0 < written.height < killed.entities_new
    rec = run_incremental(cfg)  # resume: the stale lock is taken over, the run id kept
    assert rec.run_id == killed.run_id and rec.status == "succeeded"
    after = read_knowledge(store, dedup=False)
    keys = list(zip(after["entity_type"], after["entity_id"]))
    assert len(keys) == len(set(keys)) == killed.entities_new  # none lost, none twice
    assert rec.generated == rec.entities_new == killed.entities_new  # the resumed run counts its whole work
    assert rec.entities_unchanged == 0
    assert [r.status for r in RunLedger(out).records()] == ["succeeded"]


def test_write_failing_part_way_leaves_store_readable_and_resumable(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from tests.helpers import run_row as _row

    store = tmp_path / "knowledge"
    rows = [_row("user", f"u{i}", f"text {i}", "r") for i in range(6)]
    real = pq.write_table
    calls = {"n": 0}

    def disk_full_from_second_shard(table, where, *a, **k):  # the disk stays full (also for close's flush)
        calls["n"] += 1
        if calls["n"] >= 2:
            Path(where).write_bytes(b"PAR1 half a shard")  # bytes land, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, *a, **k)

    monkeypatch.setattr("pipelines.store.shards.pq.write_table", disk_full_from_second_shard)
    with pytest.raises(OSError, match="No space left"):
        with KnowledgeWriter(store, shard_rows=2, run_id="r") as w:
            for r in rows:
                w.add(r)
    assert not list(store.glob(".*.tmp"))  # the partial temp file is gone
    assert sorted(read_knowledge(store)["entity_id"]) == ["u0", "u1"]  # readable: the complete shard only
    monkeypatch.setattr("pipelines.store.shards.pq.write_table", real)
    from pipelines.store.shards import done_keys

    done = {i for _, i in done_keys(store)}
    with KnowledgeWriter(store, shard_rows=2, run_id="r") as w:  # resume: the rest
        for r in rows:
            if r["entity_id"] not in done:
                w.add(r)
    assert sorted(read_knowledge(store, dedup=False)["entity_id"]) == [f"u{i}" for i in range(6)]


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 8] = bytes(b ^ 0xFF for b in data[mid : mid + 8])  # same size, different bytes
    path.write_bytes(bytes(data))


def test_corrupt_shard_is_detected_never_read_and_quarantined(tmp_path):
    from pipelines.store.shards import CorruptShardError, done_keys, open_shards
    from tests.helpers import run_row as _row

    store = tmp_path / "knowledge"
    with KnowledgeWriter(store, shard_rows=2, run_id="r") as w:
        for i in range(6):
            w.add(_row("user", f"u{i}", f"text {i}", "r"))
    manifest = (store / "manifest.json").read_text()
    assert manifest.count('"sha256"') == 3
    _corrupt(store / "part-00001.parquet")
    with pytest.raises(CorruptShardError, match="part-00001.parquet: checksum mismatch"):
        read_knowledge(store)
    assert {i for _, i in done_keys(store)} == {"u0", "u1", "u4", "u5"}  # u2, u3 count as not done
    open_shards(store)  # a writer opening the store moves the shard aside
    assert (store / "quarantine" / "part-00001.parquet").exists()
    assert sorted(read_knowledge(store)["entity_id"]) == ["u0", "u1", "u4", "u5"]


def test_corrupt_pool_files_are_detected(tmp_path):
    from pools.store import PoolStore, PoolStoreError, TokenizerFingerprint, write_store

    fp = TokenizerFingerprint("t", "0")
    write_store(tmp_path / "p", {"user/attribute/a": [[5, 6, 7, 8], [5, 6, 9]]}, fp)
    good = PoolStore.open(tmp_path / "p").get("user/attribute/a")
    entry = PoolStore.open(tmp_path / "p").manifest["pools"]["user/attribute/a"]
    _corrupt(tmp_path / "p" / entry["snapshot"])  # snapshot: checksum mismatch, rebuilt from the texts
    rebuilt = PoolStore.open(tmp_path / "p").get("user/attribute/a")
    assert type(rebuilt) is type(good) and len(rebuilt) == len(good) > 0
    _corrupt(tmp_path / "p" / entry["file"])  # the texts themselves: an error naming the file
    with pytest.raises(PoolStoreError, match=f"{entry['file']}: checksum mismatch"):
        PoolStore.open(tmp_path / "p").get("user/attribute/a")


def test_incremental_run_rebuilds_corrupt_shard_and_pools(tiny_model, ray_session, tmp_path):
    from pools.store import PoolStore

    data = write_table_data(tmp_path / "data", n_users=10)
    out = tmp_path / "job"
    cfg = incremental_config(tiny_model, data, out, "output.shard_rows=4")
    first = run_incremental(cfg)
    run_incremental(cfg)  # nothing to generate; the pools are built from what the first run wrote
    victim = out / "knowledge" / "part-00001.parquet"
    import pyarrow.parquet as pq

    lost = set(pq.read_table(victim).column("entity_id").to_pylist())
    _corrupt(victim)
    pool_file = sorted((out / "pools").glob("part-*.arrow"))[0]
    _corrupt(pool_file)
    second = run_incremental(cfg)
    assert second.status == "succeeded" and second.entities_new == len(lost) == second.generated
    rows = read_knowledge(out / "knowledge")
    keys = list(zip(rows["entity_type"], rows["entity_id"]))
    assert len(keys) == len(set(keys)) == first.entities_new  # every entity once again
    assert set(rows.filter(pl.col("run_id") == second.run_id)["entity_id"]) == lost
    store = PoolStore.open(out / "pools")
    for key in store.keys():
        store.token_ids(key)  # every pool file matches its checksum again (rebuilt)


# ---- kill -9 during each write phase, then a rerun: 0 rows lost, 0 doubled (issue 23) ----

# The child process runs `laser run --incremental` with one fault: the Nth atomic write whose target matches
# writes its temp file whole, then the process SIGKILLs itself before the rename (a crash mid-write); for the
# latest view (a Delta table, written by delta-rs) its data file is written, then the process dies before
# the commit.
CRASH = """
import os, signal, sys
from pathlib import Path
import deltalake, pyarrow.parquet as pq
import pipelines.store.location as storage, pipelines.store.shards as store
config, part, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
def dying(uri, data, **kwargs):
    Path(uri, "entity_type=user").mkdir(parents=True, exist_ok=True)
    pq.write_table(data, str(Path(uri, "entity_type=user", "part-00000-crash.parquet")))
    os.kill(os.getpid(), signal.SIGKILL)
if part == "latest":
    deltalake.write_deltalake = dying
real, seen = storage.atomic_write_local, [0]
def crashing(path, write):
    path = Path(path)
    if part in str(path):
        seen[0] += 1
        if seen[0] == nth:
            write(str(path.parent / f".{path.name}.crash.tmp"))
            os.kill(os.getpid(), signal.SIGKILL)
    return real(path, write)
storage.atomic_write_local = store.atomic_write_local = crashing
from jobs.cli import app
app(["run", config, "--incremental"], prog_name="laser")
"""

PHASES = {
    "old knowledge": ("/old_knowledge/part-", 3),
    "new knowledge": ("/knowledge/part-", 3),
    "ledger": ("runs.parquet", 2),
    "latest view": ("latest", 1),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_9_in_each_write_phase_then_rerun_loses_and_doubles_nothing(phase, tiny_model, ray_session, tmp_path):
    from deltalake import DeltaTable

    from pipelines.ops.schedule.latest import latest_view, read_latest

    data = write_table_data(tmp_path / "data", n_users=8)
    out = tmp_path / "job"
    mode = "paper" if phase == "old knowledge" else "latest"  # only the paper's split writes old knowledge
    cfg = incremental_config(
        tiny_model,
        data,
        out,
        "output.shard_rows=1",
        "execution.num_workers=1",
        f"execution.address={ray_session}",
        f"split.mode={mode}",
    )
    config_file = tmp_path / "job.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    part, nth = PHASES[phase]
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH, str(config_file), part, str(nth)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert list(out.rglob("*.crash.tmp")) or list(out.rglob("*-crash.parquet"))  # it died mid-write
    rec = run_incremental(cfg)  # the rerun: the dead holder's lock taken over, its run resumed
    assert rec.status == "succeeded" and [r.status for r in RunLedger(out).records()] == ["succeeded"]
    stores = [(out / "knowledge", ["entity_type", "entity_id", "run_id"])]
    if mode == "paper":
        stores.append((out / "old_knowledge", ["entity_type", "entity_id"]))
    for store, key in stores:
        rows = read_knowledge(store, dedup=False)
        assert rows.height > 0 and rows.select(key).is_duplicated().sum() == 0, store  # nothing doubled
    assert not list(out.rglob("*.tmp"))  # the writers cleared what the crash left
    again = run_incremental(cfg)  # nothing lost: a third run finds nothing to generate
    assert (again.entities_new, again.entities_changed, again.generated, again.old_generated) == (0, 0, 0, 0)
    view = read_latest(out)
    assert view.height == latest_view(out / "knowledge", out / "old_knowledge").height
    assert view.select("entity_type", "entity_id").is_duplicated().sum() == 0
    assert not any("crash" in f for f in DeltaTable(str(out / "latest")).file_uris())  # never committed
