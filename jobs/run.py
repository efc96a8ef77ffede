"""CLI commands of the knowledge job: `laser run`, `demo`, `route`, `build-pools`, `generate`, `submit`.

Registered on the `laser` app by :mod:`jobs.cli`.
"""

from __future__ import annotations

import json

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer

from jobs.config import ConfigError, JobConfig, bundled_config, load_config

if TYPE_CHECKING:
    from pipelines.ops.schedule.ledger import RunRecord

ConfigArg = typer.Argument(..., help="Job config YAML (see jobs/configs/).")
SetOpt = typer.Option(None, "--set", "-s", help="Override a config key: --set decoder.params.k=3 (repeatable).")


def _load(config: Path | None, overrides: list[str] | None) -> JobConfig:
    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _output_lock(cfg: JobConfig):
    """The output's run lock (pipelines/store/lock.py): a step run alone writes the same files as a whole run."""
    from pipelines.knowledge.paths import JobPaths
    from pipelines.store.lock import output_lock

    return output_lock(JobPaths.of(cfg).root, run_id=cfg.resolved_run_id())


def run(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    incremental: bool = typer.Option(
        False,
        "--incremental",
        help=(
            "Scheduled run: regenerate only entities whose inputs changed or are new; run ledger, lock, "
            "latest view; exit 0 done, 2 config, 3 partial, 75 locked (see jobs/scheduled.py)."
        ),
    ),
    keep_existing: bool = typer.Option(
        False,
        "--keep-existing",
        help=(
            "Keep rows that another config (model, decoder, generation rules, prompt version) wrote for "
            "unchanged inputs instead of regenerating them; the run says how many it kept."
        ),
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help=(
            "Every step but generation, then the plan: entities by type, pool and reason, prompt tokens, and the "
            "tokens and time the run would take (estimated); writes nothing."
        ),
    ),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as one JSON object on stdout."),
) -> None:
    """Run the whole job: route, plan, build pools, generate knowledge, summary. Exits 3 when entities
    failed (`laser failures CONFIG` lists them; a re-run retries them)."""
    if as_json and not dry_run:
        raise typer.BadParameter("--json goes with --dry-run (a run writes summary.json)", param_hint="--json")
    cfg = _load(config, set_)  # a config error is one line, before the decoding stack loads (seconds)
    if dry_run:
        from pipelines.knowledge.dry_run import dry_run as plan_run, print_estimate

        estimate = plan_run(cfg, keep_existing=keep_existing)
        if as_json:
            typer.echo(json.dumps(estimate.to_json(), default=str))
        else:
            print_estimate(estimate)
        return
    if incremental:
        from jobs.scheduled import run_scheduled

        raise typer.Exit(run_scheduled(cfg, keep_existing=keep_existing))
    from jobs.scheduled import run_record
    from pipelines.knowledge.job import run_job
    from pipelines.knowledge.summary import print_summary

    # a held lock: one line, exit 75 (jobs/errors.py)
    summary = run_job(cfg, keep_existing=keep_existing)
    print_summary(summary)
    code = _finished(run_record(summary), config)
    if code:
        raise typer.Exit(code)


def _finished(rec: RunRecord, config: Path) -> int:
    """A one-shot run's exit code, as a scheduled run's: 3 when entities failed (the next run retries them)."""
    from pipelines.knowledge.plan import exit_code

    if rec.given_up:
        typer.echo(f"given up on {rec.given_up} entities after identical failures (generation.give_up_after)", err=True)
    if rec.status == "partial":
        typer.secho(
            f"{rec.failed + rec.old_failed} entities failed; `laser failures {config}` lists them; a re-run "
            "retries them (exit 3)",
            fg=typer.colors.YELLOW,
            err=True,
        )
    return exit_code(rec.status)


def demo(set_: Optional[list[str]] = SetOpt) -> None:
    """Run the embedded demo (jobs/configs/demo.yaml): synthetic data, bundled model, local Ray."""
    run(bundled_config("demo"), set_, incremental=False, keep_existing=False, dry_run=False, as_json=False)


def route(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt) -> None:
    """Step 2 alone: write the routing table and group memberships."""
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.routing import step_route

    cfg = _load(config, set_)
    data = load_job_data(cfg)
    with _output_lock(cfg):
        table = step_route(cfg, data)
    typer.echo(table.group_by("entity_type", "pool_kind").len().sort("entity_type", "pool_kind"))


def build_pools(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt) -> None:
    """Step 3 alone: build the pools the job's decoder drafts from, from old knowledge (needs `laser route` first)."""
    from pipelines.knowledge.job import check_job
    from pipelines.knowledge.pool_build import step_build_pools

    cfg = _load(config, set_)
    need = check_job(cfg).card.pool
    if need == "none":
        typer.echo(f"decoder {cfg.decoder.name!r} drafts from no pool: nothing to build")
        return
    with _output_lock(cfg):
        sizes = step_build_pools(cfg, pool_need=need)
    for key, n in sorted(sizes.items()):
        typer.echo(f"{key}\t{n} texts")


def generate(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    old: bool = typer.Option(False, "--old", help="Generate the missing old knowledge (step 1) instead."),
) -> None:
    """Step 4 alone: new knowledge with the configured decoder (needs route and build-pools first)."""
    from pipelines.knowledge.generation import GenerationReport
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.job import step_generate, step_old_knowledge
    from pipelines.knowledge.paths import JobPaths
    from pipelines.knowledge.routing import read_routing
    from pipelines.knowledge.summary import JobSummary, print_summary

    cfg = _load(config, set_)
    data = load_job_data(cfg)
    with _output_lock(cfg):
        if old:
            rep, out = step_old_knowledge(cfg, data), JobPaths.of(cfg).old_knowledge
            print_summary(JobSummary.of(cfg, rep, GenerationReport(), out, rep.wall_s))
        else:
            rep, out = step_generate(cfg, data, read_routing(cfg)), JobPaths.of(cfg).knowledge
            print_summary(JobSummary.of(cfg, GenerationReport(), rep, out, rep.wall_s))


AddressOpt = typer.Option(
    "http://127.0.0.1:8265", envvar="RAY_ADDRESS", help="Ray dashboard address of the cluster (RAY_ADDRESS)."
)
PipOpt = typer.Option(None, help="Extra pip packages for the runtime env.")
WaitOpt = typer.Option(False, "--wait", help="Stream the job's logs and exit with its status.")
SubmitIncrementalOpt = typer.Option(False, "--incremental", help="Submit a scheduled incremental run.")
TokenFileOpt = typer.Option(
    None,
    "--token-file",
    help=("File with the cluster's auth token (token authentication); default: RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH."),
)
WorkingDirOpt = typer.Option(
    None,
    "--working-dir",
    help=(
        "Folder to upload as the job's working directory (the config must be inside); dotfiles and "
        "secret-looking files are never uploaded. Default: the config file alone."
    ),
)
WheelOpt = typer.Option(
    None,
    "--wheel",
    help=(
        "A built wheel of the project to ship (Ray installs it on every node); default: one built from "
        "this source tree."
    ),
)


def submit(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    address: str = AddressOpt,
    pip: Optional[list[str]] = PipOpt,
    wait: bool = WaitOpt,
    incremental: bool = SubmitIncrementalOpt,
    token_file: Optional[Path] = TokenFileOpt,
    working_dir: Optional[Path] = WorkingDirOpt,
    wheel: Optional[Path] = WheelOpt,
) -> None:
    """Submit the job to a Ray cluster (Ray Jobs); prints the submission id (with --wait: follows it). Uploads the
    config (or --working-dir) and the project as a wheel (its entry points registered on every node), and logs the
    list of files."""
    from jobs.submit import submit as submit_job

    job_id = _submitted(
        partial(
            submit_job,
            config,
            address,
            set_,
            pip=pip,
            token_file=token_file,
            incremental=incremental,
            working_dir=working_dir,
            wheel=wheel,
        )
    )
    if not wait:
        typer.echo(
            f"submitted {job_id}; follow with: laser submit ... --wait, or ray job logs --address {address} "
            f"-f {job_id} (which exits 0 even when the job fails; check `ray job status`)"
        )
        return
    _follow(address, job_id, token_file)


def _submitted(send: Callable[[], str]) -> str:
    """The submission id ``send()`` returns; a refused submission is one red line, exit 2 (77: auth)."""
    from jobs.submit import AuthError, SubmitError

    try:
        return send()
    except (ConfigError, SubmitError, ValueError) as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    except AuthError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(77) from None


def _follow(address: str, job_id: str, token_file: Path | None) -> NoReturn:
    """Stream the submitted job's logs; exit with its status."""
    from jobs.submit import follow

    typer.echo(f"submitted {job_id}; following its logs", err=True)
    code = follow(address, job_id, token_file)
    typer.echo(f"job {job_id} finished with exit status {code}", err=True)
    raise typer.Exit(code)


COMMANDS: dict[str, Callable[..., None]] = {
    "run": run,
    "demo": demo,
    "route": route,
    "build-pools": build_pools,
    "generate": generate,
    "submit": submit,
}


def register(app: typer.Typer) -> None:
    """Add the job commands to the `laser` app."""
    from jobs.errors import clean_errors

    for name, fn in COMMANDS.items():
        app.command(name)(clean_errors(fn))
