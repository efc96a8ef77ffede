"""Running a job config on a Ray cluster through Ray Jobs submission.

The cluster runs the same ``laser run`` entry point; the config file travels in the job's working
directory (``runtime_env.working_dir``), so it is referenced by its name relative to that directory.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from jobs.config import load_config


def entrypoint(config_name: str, overrides: list[str] | None = None) -> str:
    """The shell command the cluster runs: ``laser run CONFIG --set k=v ...`` (each argument quoted)."""
    args = ["laser", "run", config_name]
    for item in overrides or []:
        args += ["--set", item]
    return shlex.join(args)


def runtime_env(config_path: Path, pip: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Ray runtime env: the config's folder as working dir, optional pip packages and env vars."""
    out: dict[str, Any] = {"working_dir": str(config_path.parent.resolve())}
    if pip:
        out["pip"] = list(pip)
    if env:
        out["env_vars"] = dict(env)
    return out


def submit(config: str | Path, address: str, overrides: list[str] | None = None, pip: list[str] | None = None,
           env: dict[str, str] | None = None, submission_id: str | None = None) -> str:
    """Validate the config locally, then submit it as a Ray job at ``address``; returns the job id.

    The job inside the cluster connects to it (``execution.address=auto``) unless an override says otherwise.
    """
    from ray.job_submission import JobSubmissionClient

    path = Path(config)
    overrides = list(overrides or [])
    if not any(o.split("=", 1)[0].strip() == "execution.address" for o in overrides):
        overrides.append("execution.address=auto")
    load_config(path, overrides)  # fail here, naming the bad key, rather than on the cluster
    client = JobSubmissionClient(address)
    return client.submit_job(entrypoint=entrypoint(path.name, overrides), runtime_env=runtime_env(path, pip, env),
                             submission_id=submission_id)
