"""The Airflow DAG example parses, names the real commands and exit codes, and imports when Airflow is installed."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
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
    assert consts["OK"] == exitcodes.OK and consts["CONFIG_ERROR"] == exitcodes.CONFIG
    assert '"submit", CONFIG, "--incremental", "--wait"' in source and '"ingest", "feast", CONFIG' in source


def test_dag_example_imports_with_airflow():
    pytest.importorskip("airflow")
    spec = importlib.util.spec_from_file_location("laser_airflow_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dag.dag_id == "laser_knowledge"
    assert [t.task_id for t in module.dag.topological_sort()] == ["incremental_run", "ingest_feast", "partial_check"]


class _Fail(Exception):
    """AirflowFailException: the task fails without retries."""


class _Skip(Exception):
    """AirflowSkipException: the task is skipped."""


class _Task:
    """A PythonOperator stand-in that records its callable, its arguments and downstream tasks."""

    def __init__(self, task_id, python_callable, op_args=(), **_):
        self.task_id, self.call, self.args, self.downstream = task_id, python_callable, list(op_args), []

    def __rshift__(self, other):
        self.downstream.append(other)
        return other


def _load_with_fake_airflow(monkeypatch, laser_bin: Path):
    dag_mod, exc_mod, py_mod = (
        types.ModuleType(n) for n in ("airflow", "airflow.exceptions", "airflow.operators.python")
    )
    dag_mod.DAG = lambda **kw: contextlib.nullcontext(types.SimpleNamespace(**kw))
    exc_mod.AirflowFailException, exc_mod.AirflowSkipException = _Fail, _Skip
    py_mod.PythonOperator = _Task
    for name, mod in (("airflow", dag_mod), ("airflow.exceptions", exc_mod), ("airflow.operators.python", py_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("LASER_BIN", str(laser_bin))
    spec = importlib.util.spec_from_file_location("laser_airflow_dag_fake", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _simulate(module) -> dict[str, str]:
    """Each task's state as Airflow would set it: a task runs when its upstream succeeded; its return value is its
    XCom; an AirflowFailException fails it without retries, any other exception fails it for a retry."""
    states, xcom, task = {}, {}, module.run
    ti = types.SimpleNamespace(xcom_pull=lambda task_ids: xcom.get(task_ids))
    while task is not None:
        try:
            xcom[task.task_id] = task.call(*task.args) if task.args else task.call(ti)
            states[task.task_id] = "success"
        except _Skip:
            states[task.task_id] = "skipped"
        except _Fail:
            states[task.task_id] = "failed"
        except RuntimeError:
            states[task.task_id] = "up_for_retry"
        task = task.downstream[0] if states[task.task_id] == "success" and task.downstream else None
    return states


@pytest.mark.parametrize(
    "code, want",
    [
        (exitcodes.OK, {"incremental_run": "success", "ingest_feast": "success", "partial_check": "success"}),
        (exitcodes.PARTIAL, {"incremental_run": "success", "ingest_feast": "success", "partial_check": "failed"}),
        (exitcodes.LOCKED, {"incremental_run": "skipped"}),
        (exitcodes.CONFIG, {"incremental_run": "failed"}),  # retrying cannot succeed
        (77, {"incremental_run": "failed"}),  # the cluster refused the token
        (exitcodes.ERROR, {"incremental_run": "up_for_retry"}),
    ],
)
def test_dag_submits_then_ingests_and_retries_only_what_can_succeed(tmp_path, monkeypatch, code, want):
    laser = tmp_path / "laser"
    calls = tmp_path / "calls"
    laser.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = submit ] && exit {code}\nexit 0\n')
    laser.chmod(0o755)
    module = _load_with_fake_airflow(monkeypatch, laser)
    assert _simulate(module) == want
    lines = calls.read_text().splitlines()
    assert lines[0] == f"submit {module.CONFIG} --incremental --wait"
    assert len([c for c in lines if c.startswith("ingest feast")]) == (code in (exitcodes.OK, exitcodes.PARTIAL))
