"""The Airflow DAG example parses, names the real commands and exit codes, and imports when Airflow is installed."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pipelines.ops.schedule import exitcodes

DAG_FILE = Path(__file__).resolve().parents[2] / "jobs" / "examples" / "airflow_dag.py"


def test_dag_example_parses_and_uses_the_documented_codes():
    source = DAG_FILE.read_text()
    tree = ast.parse(source)
    consts = {
        n.targets[0].id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.targets[0], ast.Name)
    }
    assert consts["LOCKED"] == exitcodes.LOCKED and consts["PARTIAL"] == exitcodes.PARTIAL
    assert "run {CONFIG} --incremental" in source and "ingest feast {CONFIG}" in source


def test_dag_example_imports_with_airflow():
    pytest.importorskip("airflow")
    spec = importlib.util.spec_from_file_location("laser_airflow_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dag.dag_id == "laser_knowledge"
    assert [t.task_id for t in module.dag.topological_sort()] == ["incremental_run", "ingest_feast", "partial_check"]


class _Task:
    """A BashOperator stand-in that records its arguments and downstream tasks."""

    def __init__(self, task_id, bash_command, skip_on_exit_code=None, **_):
        self.task_id, self.bash_command, self.skip, self.downstream = task_id, bash_command, skip_on_exit_code, []

    def __rshift__(self, other):
        self.downstream.append(other)
        return other


def _load_with_fake_airflow(monkeypatch, laser_bin: Path):
    dag_mod, bash_mod = types.ModuleType("airflow"), types.ModuleType("airflow.operators.bash")
    dag_mod.DAG = lambda **kw: contextlib.nullcontext(types.SimpleNamespace(**kw))
    bash_mod.BashOperator = _Task
    monkeypatch.setitem(sys.modules, "airflow", dag_mod)
    monkeypatch.setitem(sys.modules, "airflow.operators.bash", bash_mod)
    monkeypatch.setenv("LASER_BIN", str(laser_bin))
    spec = importlib.util.spec_from_file_location("laser_airflow_dag_fake", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _simulate(module, env) -> dict[str, str]:
    """Each task's state as Airflow would set it: run a task when its upstream succeeded; its last stdout line is
    its XCom (the template of the check task reads it)."""
    states, xcom, task = {}, {}, module.run
    pull = "{{ ti.xcom_pull(task_ids='incremental_run') }}"
    while task is not None:
        command = task.bash_command.replace(pull, xcom.get("incremental_run", ""))
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
        lines = out.stdout.strip().splitlines()
        xcom[task.task_id] = lines[-1] if lines else ""
        states[task.task_id] = (
            "success" if out.returncode == 0 else "skipped" if out.returncode == task.skip else "failed"
        )
        task = task.downstream[0] if states[task.task_id] == "success" and task.downstream else None
    return states


@pytest.mark.parametrize(
    "code, want",
    [
        (exitcodes.OK, {"incremental_run": "success", "ingest_feast": "success", "partial_check": "success"}),
        (exitcodes.PARTIAL, {"incremental_run": "success", "ingest_feast": "success", "partial_check": "failed"}),
        (exitcodes.LOCKED, {"incremental_run": "skipped"}),
        (exitcodes.CONFIG, {"incremental_run": "failed"}),
    ],
)
def test_dag_ingests_after_done_and_partial_runs(tmp_path, monkeypatch, code, want):
    laser = tmp_path / "laser"
    calls = tmp_path / "calls"
    laser.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = run ] && {{ echo "run r1 summary"; exit $RUN_CODE; }}\nexit 0\n'
    )
    laser.chmod(0o755)
    module = _load_with_fake_airflow(monkeypatch, laser)
    assert module.PARTIAL == exitcodes.PARTIAL
    states = _simulate(module, {**os.environ, "RUN_CODE": str(code)})
    assert states == want
    ingested = [c for c in calls.read_text().splitlines() if c.startswith("ingest feast")]
    assert len(ingested) == (code in (exitcodes.OK, exitcodes.PARTIAL))
