"""Exit codes of `laser run` that a scheduler (cron, Airflow) can act on."""

from __future__ import annotations

OK = 0  # the run finished; every entity that needed knowledge has it
ERROR = 1  # an unexpected error (a bug, a lost cluster) or an engine that cannot run the model: retry or page
CONFIG = 2  # the config or the input data is invalid: fix it, retrying will not help
PARTIAL = 3  # the run finished but some entities failed (failures.jsonl); the next run retries them
LOCKED = 75  # another run holds the output's lock (EX_TEMPFAIL): nothing was done, try again later
