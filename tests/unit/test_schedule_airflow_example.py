"""The Airflow DAG example parses, names the real commands and exit codes, and imports when Airflow is installed."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from pipelines.ops.schedule import exitcodes

DAG_FILE = Path(__file__).resolve().parents[2] / "jobs" / "examples" / "airflow_dag.py"


def test_dag_example_parses_and_uses_the_documented_codes():
    source = DAG_FILE.read_text()
    tree = ast.parse(source)
    consts = {n.targets[0].id: n.value.value for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.targets[0], ast.Name)}
    assert consts["LOCKED"] == exitcodes.LOCKED
    assert "run {CONFIG} --incremental" in source and "ingest feast {CONFIG}" in source


def test_dag_example_imports_with_airflow():
    pytest.importorskip("airflow")
    spec = importlib.util.spec_from_file_location("laser_airflow_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dag.dag_id == "laser_knowledge"
    assert [t.task_id for t in module.dag.topological_sort()] == ["incremental_run", "ingest_feast"]
