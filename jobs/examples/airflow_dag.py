"""Airflow DAG: a daily incremental knowledge run, then Feast ingestion.

Copy into your Airflow ``dags/`` folder and set ``LASER_CONFIG`` (and ``LASER_BIN`` when `laser` is not
on the workers' PATH). Exit codes of ``laser run --incremental`` (as the cron recipe in docs/operations.md
reads them): 0 done, entities given up on after identical failures included: ingestion follows; 3
partial (some entities failed, the next run retries them): the run task succeeds and says ``partial``,
ingestion follows (the knowledge that was written is served), then ``partial_check`` fails so someone
looks (``laser failures CONFIG`` lists them); Airflow does not retry it, the next scheduled run does; 75
another run holds the output's lock: the task is skipped (Airflow's ``skip_on_exit_code``) and so is
ingestion; 2 invalid config or data, 1 unexpected error: the task fails, nothing is ingested. Airflow is
not a dependency of this project; this file needs Airflow >= 2.6 (BashOperator.skip_on_exit_code).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow import DAG

try:  # Airflow 3 moved the operator into the standard provider
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

LASER = os.environ.get("LASER_BIN", "laser")
CONFIG = os.environ.get("LASER_CONFIG", "/etc/laser/job.yaml")
LOCKED = 75  # pipelines.ops.schedule.exitcodes.LOCKED
PARTIAL = 3  # pipelines.ops.schedule.exitcodes.PARTIAL
# exit 3 becomes success with "partial" as the task's last output line (its XCom), so ingestion follows
RUN = f"{LASER} run {CONFIG} --incremental; rc=$?; if [ $rc -eq {PARTIAL} ]; then echo partial; exit 0; fi; exit $rc"
CHECK = (
    "if [ \"{{ ti.xcom_pull(task_ids='incremental_run') }}\" = partial ]; then "
    f"echo 'some entities failed; {LASER} failures {CONFIG} lists them; the next run retries them'; exit 1; fi"
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
    run = BashOperator(
        task_id="incremental_run",
        bash_command=RUN,
        skip_on_exit_code=LOCKED,
        execution_timeout=timedelta(hours=12),
    )
    ingest = BashOperator(
        task_id="ingest_feast",
        bash_command=f"{LASER} ingest feast {CONFIG}",
        skip_on_exit_code=LOCKED,
    )
    partial = BashOperator(task_id="partial_check", bash_command=CHECK, retries=0)
    run >> ingest >> partial
