"""Knowledge stores, run ledger and run lock on fsspec URIs: the in-process ``memory://`` filesystem (an
object store without rename), ``file://`` URIs, and S3 served locally by moto's server, where the latest
view (a Delta table, which delta-rs cannot keep in ``memory://``) is written too."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import pipelines.store.knowledge as kn
import pipelines.store.shards as ss
from pipelines.store.lock import output_lock
from pipelines.ops.schedule.latest import read_latest, update_latest
from pipelines.ops.schedule.ledger import RunLedger, RunRecord
from pipelines.store.lock import LOCK_FILE, LockHeld, RunLock
from pipelines.store.location import Location, StorageError
from tests.helpers import knowledge_row as row
from tests.helpers import local_s3, use_s3


@pytest.fixture
def mem_uri():
    """A fresh folder on fsspec's in-process memory filesystem, removed afterwards."""
    uri = f"memory://laser-test/{uuid.uuid4().hex}"
    yield uri
    loc = Location.of(uri)
    if loc.exists():
        loc.fs.rm(loc.path, recursive=True)


def write(store, ids, shard_rows=3, run_id="r1"):
    with kn.KnowledgeWriter(store, shard_rows=shard_rows, run_id=run_id) as w:
        for i in ids:
            w.add(row(i, run_id=run_id))


def test_store_round_trip_on_memory_uri(mem_uri):
    store = f"{mem_uri}/knowledge"
    write(store, range(7))
    manifest = json.loads((Location.of(store) / "manifest.json").read_text())
    names = [s["file"] for s in manifest["shards"]]
    assert len(names) == 3 and all(
        ss._SHARD_RE.match(n) and len(n) == len("part-00000-12345678.parquet") for n in names
    )  # unique names off local disks
    assert sorted(kn.read_knowledge(store)["entity_id"]) == sorted(f"u{i}" for i in range(7))
    assert ss.done_keys(store) == {("user", f"u{i}") for i in range(7)}


def test_crash_before_log_put_commits_nothing_and_resume_completes(mem_uri, monkeypatch):
    store = f"{mem_uri}/knowledge"
    write(store, range(3))  # one committed shard
    puts = {"n": 0}
    real_put = ss._put_log_entry

    def dies_on_second_commit(path, data):
        puts["n"] += 1
        if puts["n"] >= 2:
            raise OSError("connection reset")
        real_put(path, data)

    monkeypatch.setattr(ss, "_put_log_entry", dies_on_second_commit)
    with pytest.raises(OSError):
        write(store, range(3, 12))  # shard 1 commits; shard 2 is put, its log entry put fails
    monkeypatch.undo()
    root = Location.of(store)
    assert len(root.names("part-*.parquet")) > len(ss.Manifest.load(store).shards) == 2  # uncommitted objects...
    assert ss.done_keys(store) == {("user", f"u{i}") for i in range(6)}  # ...but readers trust the manifest only
    done = {i for _, i in ss.done_keys(store)}
    write(store, [i for i in range(12) if f"u{i}" not in done])  # resume: the writer drops the orphan first
    assert len(root.names("part-*.parquet")) == len(ss.Manifest.load(store).shards) == 4
    ids = kn.read_knowledge(store, dedup=False)["entity_id"].to_list()
    assert sorted(ids) == sorted(f"u{i}" for i in range(12))  # nothing lost, nothing twice


def test_corrupt_shard_on_memory_uri_is_quarantined(mem_uri):
    store = f"{mem_uri}/knowledge"
    write(store, range(6))
    first = Location.of(store) / ss.Manifest.load(store).shards[0]["file"]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(ss.CorruptShardError, match="checksum mismatch"):
        kn.read_knowledge(store)
    ss.open_shards(store)  # the next run's verifying open moves it aside
    assert (Location.of(store) / "quarantine" / first.name).exists()
    assert ss.done_keys(store) == {("user", f"u{i}") for i in range(3, 6)}


def test_failures_and_ledger_on_memory_uri(mem_uri):
    store = f"{mem_uri}/knowledge"
    with kn.KnowledgeWriter(store, run_id="r1") as w:
        w.add(row(1))
        w.add_failure("user", "u2", "too long")
        w.add_failure("user", "u3", "bad")
    assert sorted(ss.read_failures(store)["entity_id"]) == ["u2", "u3"]
    ledger = RunLedger(mem_uri)
    ledger.save(RunRecord(run_id="a", decoder="laser", config_hash="h"))
    ledger.save(RunRecord(run_id="a", decoder="laser", config_hash="h", status="succeeded", watermark=5))
    assert [(r.run_id, r.status) for r in RunLedger(mem_uri).records()] == [("a", "succeeded")]


def test_file_uri_is_a_local_path(tmp_path):
    store = f"file://{tmp_path}/knowledge"
    write(store, range(4))
    assert sorted(p.name for p in (tmp_path / "knowledge").glob("*.parquet")) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert kn.read_knowledge(tmp_path / "knowledge").height == 4


def test_unknown_or_unusable_scheme_is_named():
    with pytest.raises(StorageError, match="nosuchfs://bucket/x: no usable filesystem"):
        Location.of("nosuchfs://bucket/x")
    try:
        Location.of("hdfs://namenode:8020/x")  # usable only with a JVM and libhdfs
    except StorageError as exc:
        assert "hdfs://namenode:8020/x: no usable filesystem" in str(exc)


def test_lease_lock_on_memory_uri(mem_uri):
    with RunLock(mem_uri, run_id="first") as lock:
        assert lock.stale is None and (Location.of(mem_uri) / LOCK_FILE).exists()
        with pytest.raises(LockHeld, match="another run holds this output's lock") as err:
            RunLock(mem_uri, run_id="second").acquire()
        assert err.value.holder["run_id"] == "first"
    assert not (Location.of(mem_uri) / LOCK_FILE).exists()  # released: deleted


def test_expired_lease_is_taken_over_and_a_live_one_renewed(mem_uri):
    lock_obj = Location.of(mem_uri) / LOCK_FILE
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    lock_obj.write_text(json.dumps({"pid": 1, "host": "gone", "run_id": "killed", "token": "t", "expires": past}))
    with RunLock(mem_uri, run_id="next", lease_s=1.5) as lock:
        assert lock.stale["run_id"] == "killed"
        first = json.loads(lock_obj.read_text())["expires"]
        time.sleep(1.0)  # the holder renews every lease_s / 3: never expires while it lives
        assert json.loads(lock_obj.read_text())["expires"] > first
        with pytest.raises(LockHeld):
            RunLock(mem_uri, run_id="other").acquire()


def test_a_lost_lease_stops_the_run_before_its_next_write(mem_uri):
    from pipelines.store.lock import LockLost

    lock_obj = Location.of(mem_uri) / LOCK_FILE
    with RunLock(mem_uri, run_id="slow", lease_s=0.6):
        writer = kn.KnowledgeWriter(f"{mem_uri}/knowledge", shard_rows=1, run_id="slow")
        writer.add(row(1))  # written while the lease is ours
        held = json.loads(lock_obj.read_text())
        lock_obj.write_text(json.dumps({**held, "token": "another-run"}))  # another run took the lease over
        time.sleep(0.5)  # the holder's next renewal (every lease_s / 3) finds out
        with pytest.raises(LockLost, match="lost its lease"):
            writer.add(row(2))
        with pytest.raises(LockLost):
            RunLedger(mem_uri).save(RunRecord(run_id="slow", decoder="laser", config_hash="h"))
    assert ss.done_keys(f"{mem_uri}/knowledge") == {("user", "u1")}
    assert json.loads(lock_obj.read_text())["token"] == "another-run"  # the other run's lease is left alone


@pytest.fixture(scope="module")
def s3_endpoint():
    """A local S3 (moto's server on the loopback, in its own process); skipped where moto or s3fs is not
    installed."""
    pytest.importorskip("s3fs")
    with local_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_uri(s3_endpoint, monkeypatch):
    import fsspec

    use_s3(s3_endpoint, monkeypatch)
    fs = fsspec.filesystem("s3")
    bucket = f"laser-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    return f"s3://{bucket}/job"


def test_store_ledger_and_lock_on_local_s3(s3_uri):
    store = f"{s3_uri}/knowledge"
    write(store, range(5))
    assert sorted(kn.read_knowledge(store)["entity_id"]) == sorted(f"u{i}" for i in range(5))
    RunLedger(s3_uri).save(RunRecord(run_id="a", decoder="laser", config_hash="h", status="succeeded"))
    assert RunLedger(s3_uri).last_succeeded().run_id == "a"
    with RunLock(s3_uri, run_id="first"):  # exclusive create = a conditional put (If-None-Match: *)
        with pytest.raises(LockHeld):
            RunLock(s3_uri, run_id="second").acquire()
    with RunLock(s3_uri, run_id="third") as lock:  # released: free again
        assert lock.stale is None


def test_latest_view_is_a_delta_table_on_local_s3(s3_uri, s3_endpoint):
    """The latest view on S3: written whole, then merged; polars reads it with S3 options alone."""
    import polars as pl

    store = f"{s3_uri}/knowledge"
    write(store, range(3), run_id="r1")
    with output_lock(s3_uri, run_id="test"):
        assert update_latest(s3_uri, store, run_id="r1") == 3
    write(store, [1, 5], run_id="r2")
    with output_lock(s3_uri, run_id="test"):
        assert update_latest(s3_uri, store, run_id="r2") == 2
    assert read_latest(s3_uri)["entity_id"].to_list() == ["u0", "u1", "u2", "u5"]
    options = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    view = pl.read_delta(f"{s3_uri}/latest", storage_options=options)
    assert dict(zip(view["entity_id"], view["run_id"]))["u1"] == "r2"
    assert read_latest(s3_uri, version=0)["run_id"].to_list() == ["r1"] * 3


@pytest.mark.slow
def test_one_shot_then_scheduled_run_on_an_s3_output(tiny_model, ray_session, tmp_path, s3_uri):
    """`laser run` then a scheduled run, output on S3 (no rename): the scheduled run regenerates only the
    edited user; stores, summary, ledger and latest view live at the URI, the pools in
    ``output.work_dir``."""
    import polars as pl

    from pipelines.knowledge.job import run_job
    from test_schedule_incremental import edit_users, incremental_config, write_table_data

    data = write_table_data(tmp_path / "data", n_users=10)
    cfg = incremental_config(tiny_model, data, s3_uri, f"output.work_dir={tmp_path / 'work'}")
    first = run_job(cfg)
    assert first.new.done > 0 and first.new.failed == 0
    assert json.loads((Location.of(s3_uri) / "summary.json").read_text())["total_rows"] == first.new.done
    users = sorted(kn.read_knowledge(f"{s3_uri}/knowledge").filter(pl.col("entity_type") == "user")["entity_id"])
    edit_users(data, users[:1])
    second = run_job(cfg, incremental=True).record
    assert (second.entities_changed, second.generated, second.entities_new) == (1, 1, 0)
    assert [r.status for r in RunLedger(s3_uri).records()] == ["succeeded", "succeeded"]  # every run is recorded
    latest = read_latest(s3_uri)
    assert latest.filter(pl.col("run_id") == second.run_id)["entity_id"].to_list() == users[:1]
    assert not (Location.of(s3_uri) / LOCK_FILE).exists()  # the lease object is gone after the run
    assert (tmp_path / "work" / "pools" / "manifest.json").exists()


def test_cli_refuses_what_a_uri_output_cannot_do(tmp_path):
    from typer.testing import CliRunner

    from jobs.cli import app

    config = tmp_path / "job.yaml"
    config.write_text("output:\n  path: nosuchfs://bucket/job\n")
    res = CliRunner().invoke(app, ["run", str(config), "--incremental"])
    assert res.exit_code == 2 and "nosuchfs://bucket/job: no usable filesystem" in res.output
    res = CliRunner().invoke(app, ["encode", str(config), "--set", "output.path=memory://b/job"])
    assert res.exit_code == 2 and "need a local output.path" in res.output and "memory://b/job" in res.output
