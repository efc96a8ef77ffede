"""Airflow DAG: a daily incremental knowledge run on the team's Ray cluster, then Feast ingestion.

Copy into your Airflow ``dags/`` folder and set ``LASER_CONFIG``, ``RAY_ADDRESS`` (the cluster's dashboard,
read by ``laser submit``) and ``LASER_BIN`` when `laser` is not on the workers' PATH. The run is submitted
with ``laser submit --incremental --wait``, which follows the Ray job and exits with its driver's exit code,
the codes of ``laser run --incremental`` (docs/operations.md):

- 0 done (entities given up on after identical failures included): ingestion follows;
- 3 partial (some entities failed, the next run retries them): the task succeeds and returns ``partial``,
  ingestion follows (the knowledge that was written is served), then ``partial_check`` fails so someone
  looks (``laser failures CONFIG`` lists them); no retry, the next scheduled run retries them;
- 75 another run holds the output's lock: the task is skipped, and so is ingestion;
- 2 invalid config or data, 77 the cluster refused the token: the task fails at once, without retries
  (retrying cannot succeed);
- anything else (1: an unexpected error, a lost cluster, an engine that could not start): the task fails
  and Airflow retries it.

Airflow is not a dependency of this project; this file needs Airflow >= 2.6.
"""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timedelta

from airflow import DAG
from airflow.exceptions import AirflowFailException, AirflowSkipException

try:  # Airflow 3 moved the operator into the standard provider
    from airflow.providers.standard.operators.python import PythonOperator
except ImportError:  # Airflow 2
    from airflow.operators.python import PythonOperator

LASER = os.environ.get("LASER_BIN", "laser")
CONFIG = os.environ.get("LASER_CONFIG", "/etc/laser/job.yaml")
OK = 0  # pipelines.ops.schedule.exitcodes.OK
PARTIAL = 3  # pipelines.ops.schedule.exitcodes.PARTIAL
LOCKED = 75  # pipelines.ops.schedule.exitcodes.LOCKED
CONFIG_ERROR = 2  # pipelines.ops.schedule.exitcodes.CONFIG
AUTH = 77  # laser submit: the cluster refused the token
NO_RETRY = (CONFIG_ERROR, AUTH)  # retrying cannot succeed


def laser(*args: str) -> str:
    """Run ``laser ARGS``; its exit code becomes the task's state (module docstring). Returns ``done`` or
    ``partial`` (the task's XCom)."""
    code = subprocess.run([LASER, *args], check=False).returncode
    if code == OK:
        return "done"
    if code == PARTIAL:
        return "partial"
    if code == LOCKED:
        raise AirflowSkipException("another run holds the output's lock; the next scheduled run does the work")
    if code in NO_RETRY:
        raise AirflowFailException(f"laser {args[0]} exited {code}: fix the config, data or token; not retried")
    raise RuntimeError(f"laser {args[0]} exited {code}")  # Airflow retries


def check_partial(ti: object) -> None:
    """Fail when the run was partial, so that someone looks (the knowledge written was ingested already)."""
    if ti.xcom_pull(task_ids="incremental_run") == "partial":  # type: ignore[attr-defined]
        raise AirflowFailException(
            f"some entities failed; `{LASER} failures {CONFIG}` lists them; the next run retries them"
        )


with DAG(
    dag_id="laser_knowledge",
    description="Regenerate LLM knowledge for changed users/items, then refresh the Feast online store",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # the output lock enforces this anyway
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
    tags=["laser", "knowledge"],
) as dag:
    run = PythonOperator(
        task_id="incremental_run",
        python_callable=laser,
        op_args=["submit", CONFIG, "--incremental", "--wait"],
        execution_timeout=timedelta(hours=12),
    )
    ingest = PythonOperator(task_id="ingest_feast", python_callable=laser, op_args=["ingest", "feast", CONFIG])
    partial = PythonOperator(task_id="partial_check", python_callable=check_partial, retries=0)
    run >> ingest >> partial
