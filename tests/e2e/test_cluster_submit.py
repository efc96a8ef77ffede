"""A real two-node Ray cluster on loopback with token authentication: `laser submit --wait` end to end.

The test starts a head and a second node with `ray start --block` in their own process groups (with a
private temp dir and a random token), and stops exactly those processes afterwards.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.fuzz_server import free_port
import yaml

from pipelines.store.knowledge import read_knowledge
from test_job_e2e import expected_new_entities, job_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
LASER = [sys.executable, "-c", "from jobs.cli import app; app(prog_name='laser')"]


class Cluster:
    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="lray", dir="/tmp")  # short: Ray's unix socket paths must fit
        self.token = secrets.token_hex(16)
        self.token_file = Path(self.tmp) / "token"
        self.token_file.write_text(self.token)
        self.port, self.dash = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dash}"
        bin_dir = str(Path(sys.executable).parent)  # the nodes' `python` is this venv's, as when it is activated
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        }
        self.procs: list[subprocess.Popen] = []

    def _start(self, *args: str, log: str) -> None:
        out = open(Path(self.tmp) / log, "w")
        self.procs.append(
            subprocess.Popen(
                [
                    RAY,
                    "start",
                    "--block",
                    "--node-ip-address=127.0.0.1",
                    "--num-cpus=1",
                    "--disable-usage-stats",
                    *args,
                ],
                env=self.env,
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )

    def get(self, path: str) -> object:
        req = urllib.request.Request(self.address + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def _wait(self, ready, what: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"ray {what} did not come up; logs in {self.tmp}")

    def alive_nodes(self) -> int:
        nodes = self.get("/api/v0/nodes")["data"]["result"]["result"]
        return sum(n["state"] == "ALIVE" for n in nodes)

    def start(self) -> "Cluster":
        self._start(
            "--head",
            f"--port={self.port}",
            f"--dashboard-port={self.dash}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--temp-dir={self.tmp}",
            log="head.log",
        )
        self._wait(lambda: self.alive_nodes() == 1, "head")
        self._start(f"--address=127.0.0.1:{self.port}", log="worker.log")
        self._wait(lambda: self.alive_nodes() == 2, "worker node")
        return self

    def stop(self) -> None:
        """SIGTERM to the process groups we started, then SIGKILL to whatever of ours is left."""
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in _pids_mentioning(self.tmp):  # daemons that left the groups but run in our temp dir
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def cluster():
    import ray

    if ray.is_initialized():  # an in-process Ray left by earlier tests would compete with the cluster's nodes
        ray.shutdown()
    c = Cluster()
    try:
        yield c.start()
    finally:
        c.stop()
        assert not _pids_mentioning(c.tmp)


def _laser(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # the token comes from --token-file
    return subprocess.run([*LASER, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_submit_wait_runs_on_both_nodes_with_token_auth(cluster, tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = job_config(tiny_model, out)
    config = tmp_path / "conf" / "job.yaml"
    config.parent.mkdir()
    tree = cfg.model_dump(mode="json")
    tree["execution"]["address"] = None  # submit sets auto
    config.write_text(yaml.safe_dump(tree))

    refused = _laser("submit", str(config), "--address", cluster.address)  # no token
    assert refused.returncode == 77 and "token authentication" in refused.stderr

    res = _laser("submit", str(config), "--address", cluster.address, "--wait", "--token-file", str(cluster.token_file))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "knowledge rows in store" in res.stdout  # the job's own summary, streamed
    rows = read_knowledge(out / "knowledge")
    keys = list(zip(rows["entity_type"], rows["entity_id"]))
    assert len(keys) == len(set(keys)) and set(keys) == expected_new_entities(cfg)
    actors = cluster.get(
        "/api/v0/actors?filter_keys=class_name&filter_predicates=%3D&filter_values=GenerationWorker&limit=100"
    )["data"]["result"]["result"]
    assert len({a["node_id"] for a in actors}) == 2  # one generation actor on each node
    tasks = cluster.get("/api/v0/tasks?limit=10000")["data"]["result"]["result"]
    parts = [t for t in tasks if t["name"].endswith("build_part")]
    assert len({t["node_id"] for t in parts}) == 2, parts  # the pools' build tasks ran on both nodes too

    failing = _laser(
        "submit",
        str(config),
        "--address",
        cluster.address,
        "--wait",
        "--token-file",
        str(cluster.token_file),
        "--set",
        "dataset.format=table",
        "--set",
        f"dataset.path={tmp_path}/none",
    )
    assert failing.returncode != 0  # a failed job is not a success


def test_submit_refuses_relative_output_before_sending(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("output:\n  path: runs/job\n")
    res = _laser("submit", str(config), "--address", "http://127.0.0.1:9")
    assert res.returncode == 2 and "output.path: 'runs/job' is relative" in res.stderr
