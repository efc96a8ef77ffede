"""`laser submit` to a two-node Ray cluster whose worker node has every dependency but not the project.

The worker node runs from a scratch venv whose site-packages links every entry of this venv's except the
project's own (its dist-info and editable finder), so there `import laser` fails and no entry point of the
project exists. The head has no CPUs: the job's driver runs there, every actor and task on the worker node,
where only the wheel that `laser submit` ships provides the code and the entry points.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from jobs import submit as submit_mod
from pipelines.store.knowledge import read_knowledge
from test_cluster_submit import RAY, Cluster, _laser, _pids_mentioning
from test_job_e2e import expected_new_entities, job_config

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sysconfig.get_paths()["purelib"])
PROJECT_GROUPS = ("vllm.general_plugins", "laser.pool_stores")
# what a process sees of the project: where laser comes from (or why not) and the project's entry points
LOOK = (
    "import importlib.metadata as m, json\n"
    "try:\n    import laser; where = laser.__file__\nexcept ImportError as e:\n    where = repr(e)\n"
    f"groups = {{g: sorted(e.name for e in m.entry_points(group=g)) for g in {PROJECT_GROUPS!r}}}\n"
    "print(json.dumps({'laser': where, **groups}))\n"
)
# run on the cluster as a Ray job: an actor on the worker node reports what it, vLLM's plug-in loader and a
# child process of its own (as vLLM's engine core is) see
PROBE = f"""
import json, subprocess, sys
import ray

LOOK = {LOOK!r}

@ray.remote(num_cpus=1)
class Probe:
    def run(self):
        exec(LOOK, {{}})  # prints; the values again below
        from laser.vllm.sources import store_opener
        from vllm.plugins import load_plugins_by_group
        child = json.loads(subprocess.check_output([sys.executable, "-c", LOOK], text=True))
        return {{
            "node": ray.get_runtime_context().get_node_id(),
            "python": sys.executable,
            "opener": store_opener().__module__,
            "vllm_plugins": sorted(load_plugins_by_group("vllm.general_plugins")),
            "child": child,
        }}

ray.init()
print("PROBE " + json.dumps(ray.get(Probe.remote().run.remote())))
"""


def _is_project(entry: Path) -> bool:
    name = entry.name.lower()
    if name.startswith("laser_knowledge") or (name.startswith("__editable__") and "laser" in name):
        return True
    return entry.suffix == ".pth" and str(REPO) in entry.read_text()


def bare_python(root: Path) -> Path:
    """A venv at ``root`` with this venv's packages (linked) except the project; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    for entry in SITE.iterdir():
        if not _is_project(entry) and not (Path(site) / entry.name).exists():
            (Path(site) / entry.name).symlink_to(entry)
    pip = root / "bin" / "pip"  # Ray pip-installs a py_modules wheel with the `pip` on the node's PATH
    pip.write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@"\n')
    pip.chmod(0o755)
    return python


def _look(python: Path, cwd: str, env: dict[str, str]) -> dict:
    return json.loads(subprocess.check_output([str(python), "-c", LOOK], cwd=cwd, env=env, text=True))


class BareWorkerCluster(Cluster):
    """Head from this venv with no CPUs; one worker node (2 CPUs) running the bare venv's python."""

    def __init__(self) -> None:
        super().__init__()
        self.python = bare_python(Path(self.tmp) / "venv")
        venv_bin = str(Path(sys.executable).parent)
        path = [p for p in os.environ.get("PATH", "").split(":") if p and p != venv_bin]
        self.bare_env = {k: v for k, v in self.env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.bare_env["PATH"] = ":".join([str(self.python.parent), *path])

    def _node(self, cmd: list[str], args: list[str], env: dict[str, str], log: str) -> None:
        out = open(Path(self.tmp) / log, "w")
        self.procs.append(
            subprocess.Popen(
                [*cmd, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args],
                env=env,
                cwd=self.tmp,  # not the repo: a process's cwd would put the project on its path
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )

    def start(self) -> "BareWorkerCluster":
        head = ["--head", "--num-cpus=0", f"--port={self.port}", f"--dashboard-port={self.dash}"]
        head += ["--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--temp-dir={self.tmp}"]
        self._node([RAY], head, self.env, "head.log")
        self._wait(lambda: self.alive_nodes() == 1, "head")
        worker = [str(self.python), "-m", "ray.scripts.scripts"]
        self._node(worker, [f"--address=127.0.0.1:{self.port}", "--num-cpus=2"], self.bare_env, "worker.log")
        self._wait(lambda: self.alive_nodes() == 2, "worker node")
        return self

    def worker_node_id(self) -> str:
        nodes = self.get("/api/v0/nodes")["data"]["result"]["result"]
        return next(n["node_id"] for n in nodes if not n["is_head_node"] and n["state"] == "ALIVE")


@pytest.fixture(scope="module")
def cluster():
    import ray

    if ray.is_initialized():  # an in-process Ray left by earlier tests would compete with the cluster's nodes
        ray.shutdown()
    c = BareWorkerCluster()
    try:
        seen = _look(c.python, c.tmp, c.bare_env)  # the worker node's environment really lacks the project
        assert seen["laser"].startswith("ModuleNotFoundError"), seen
        assert "laser" not in seen["vllm.general_plugins"] and seen["laser.pool_stores"] == [], seen
        yield c.start()
    finally:
        c.stop()
        assert not _pids_mentioning(c.tmp)


@pytest.mark.slow
def test_the_wheel_registers_the_entry_points_in_actors_and_their_children(cluster, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "probe.py").write_text(PROBE)
    client = submit_mod.client(cluster.address, cluster.token_file)
    wheel = submit_mod.project_wheel(tmp_path)
    env = submit_mod.runtime_env(wd, wheel)
    job = submit_mod._submit_with_retry(client, cluster.address, {"entrypoint": "python probe.py", "runtime_env": env})
    deadline = time.time() + 600
    while not (status := client.get_job_info(job).status).is_terminal() and time.time() < deadline:
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert str(status) == "SUCCEEDED", logs[-3000:]
    probe = json.loads(next(line for line in logs.splitlines() if line.startswith("PROBE "))[len("PROBE ") :])
    assert probe["node"] == cluster.worker_node_id() and probe["python"] == str(cluster.python)
    assert "laser" in probe["vllm_plugins"] and probe["opener"] == "pools.store"
    child = probe["child"]  # a process the actor starts, as vLLM starts its engine core
    assert "laser" in child["vllm.general_plugins"] and child["laser.pool_stores"] == ["pools"]
    assert "runtime_resources" in child["laser"] and not child["laser"].startswith(str(REPO)), child


@pytest.mark.slow
def test_submit_writes_knowledge_from_the_bare_node(cluster, tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = job_config(tiny_model, out)
    config = tmp_path / "conf" / "job.yaml"
    config.parent.mkdir()
    tree = cfg.model_dump(mode="json")
    tree["execution"]["address"] = None  # submit sets auto
    config.write_text(yaml.safe_dump(tree))
    res = _laser("submit", str(config), "--address", cluster.address, "--wait", "--token-file", str(cluster.token_file))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "knowledge rows in store" in res.stdout
    rows = read_knowledge(out / "knowledge")
    keys = list(zip(rows["entity_type"], rows["entity_id"]))
    assert len(keys) == len(set(keys)) and set(keys) == expected_new_entities(cfg)
    actors = cluster.get(
        "/api/v0/actors?filter_keys=class_name&filter_predicates=%3D&filter_values=GenerationWorker&limit=100"
    )["data"]["result"]["result"]
    assert actors and {a["node_id"] for a in actors} == {cluster.worker_node_id()}  # the head has no CPUs


def test_the_shipped_wheel_installs_offline_with_its_entry_points_and_no_requirements(tmp_path):
    wheel = submit_mod.project_wheel(tmp_path / "a")
    again = submit_mod.project_wheel(tmp_path / "b")
    assert wheel.name == again.name and wheel.read_bytes() == again.read_bytes()  # same code, same upload name
    name, version, tag, *_ = wheel.name.split("-")
    assert name == "laser_knowledge" and tag[0] == "1" and len(tag) == 17  # build tag: a hash of the contents
    target = tmp_path / "target"  # as Ray installs a py_modules wheel: pip install WHEEL --target=DIR
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "-q", str(wheel), f"--target={target}"]
    subprocess.run(cmd, check=True)  # no Requires-Dist: nothing to fetch (it would reinstall torch, ...)
    (dist,) = importlib.metadata.distributions(path=[str(target)])
    assert dist.requires is None and dist.version == version
    groups = {(e.group, e.name, e.value) for e in dist.entry_points}
    assert {("vllm.general_plugins", "laser", "laser.vllm.plugin:register")} <= groups
    assert ("laser.pool_stores", "pools", "pools.store:open_store") in groups
    assert (target / "laser" / "vllm" / "cost_prior.json").is_file()  # package data travels
    changed = tmp_path / "changed.whl"  # other contents, another name: Ray reuses an upload by name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(changed, "w") as dst:
        for item in src.namelist():
            dst.writestr(item, src.read(item) + (b"# edit\n" if item == "laser/__init__.py" else b""))
    renamed = tmp_path / f"laser_knowledge-{version}-py3-none-any.whl"
    renamed.write_bytes(changed.read_bytes())
    other = submit_mod.project_wheel(tmp_path / "c", renamed)
    assert other.name != wheel.name and other.name.startswith(f"laser_knowledge-{version}-1")


def test_a_bad_wheel_is_refused_in_one_line(tmp_path):
    with pytest.raises(submit_mod.SubmitError, match=r"--wheel .*/none.whl: no such file"):
        submit_mod.project_wheel(tmp_path, tmp_path / "none.whl")
    other = tmp_path / "other_pkg-1.0-py3-none-any.whl"
    other.write_bytes(b"")
    with pytest.raises(submit_mod.SubmitError, match="not a wheel of laser-knowledge"):
        submit_mod.project_wheel(tmp_path, other)
    broken = tmp_path / "laser_knowledge-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(submit_mod.SubmitError, match=r"laser_knowledge-1.0-py3-none-any.whl: File is not a zip file"):
        submit_mod.project_wheel(tmp_path, broken)
