"""The `laser` command line. Every command lives in the module that owns its work, whose `register(app)` adds it;
this file only names those modules and the help panel their commands are listed under (`COMMANDS`). The research
tools (`benchmarks`, `training`) are named here, never imported: their module loads when one of their commands
runs, so `laser --help` and `laser run` do not import them."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:  # typer carries its own click; its classes are what a TyperGroup holds
    from typer._click.core import Command, Context
    from typer._click.formatting import HelpFormatter

JOB, OPERATIONS, RESEARCH = "Job", "Operations", "Research"

# (module whose `register(app)` adds commands, their help panel, None: loaded now | {command: its one-line help}:
# loaded when one of them runs). tests/integration/test_cli_registration.py checks the help against the modules.
COMMANDS: tuple[tuple[str, str, dict[str, str] | None], ...] = (
    ("jobs.run", JOB, None),
    ("jobs.init", JOB, None),
    ("jobs.recommend", JOB, None),
    ("jobs.feature_store", OPERATIONS, None),
    ("jobs.failures", OPERATIONS, None),
    ("jobs.runs", OPERATIONS, None),
    ("jobs.decoders", OPERATIONS, None),
    ("jobs.pools_cli", OPERATIONS, None),
    ("jobs.ctr_eval", RESEARCH, None),
    (
        "training.cli",
        RESEARCH,
        {
            "train-draft": "Distil a draft from the target on its own generations for the job's prompts; "
            "resumes after a kill.",
            "train-recommender": "Fine-tune the recommender on next-item prediction from the old histories; "
            "resumes after a kill.",
            "train-align": "Align a draft to the frozen target with AtSpeed's losses; resumes after a kill.",
            "train-redrafter": "Train a ReDrafter head by distillation on the target's own generations "
            "(resumes after a kill).",
        },
    ),
    ("benchmarks.cli", RESEARCH, {"bench": "Benchmarks: each prints a table and writes JSON + a PNG plot."}),
)


class _Deferred(TyperCommand):
    """A command listed in the help whose module loads only when the command runs."""

    def __init__(self, name: str, module: str, short_help: str, panel: str) -> None:
        super().__init__(name, help=short_help, rich_help_panel=panel)
        self.command_name, self.module = name, module

    def load(self) -> Command:
        """The real command, from its module's `register` on a fresh app of the same settings."""
        sub = typer.Typer(rich_markup_mode=None)
        importlib.import_module(self.module).register(sub)
        command = typer.main.get_group(sub).commands[self.command_name]
        setattr(command, "rich_help_panel", self.rich_help_panel)  # typer's commands and groups both have one
        return command


class _LaserGroup(TyperGroup):
    """The root group: deferred commands load when resolved; the plain help lists commands by panel."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for module, panel, deferred in COMMANDS:
            for name, short_help in (deferred or {}).items():
                self.commands[name] = _Deferred(name, module, short_help, panel)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Deferred):
            command = self.commands[cmd_name] = command.load()
        return command

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        listed = [(name, cmd) for name, cmd in self.commands.items() if not cmd.hidden]  # no load: help stays fast
        if not listed:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in listed)
        panels: dict[str, list[tuple[str, str]]] = {}
        for name, cmd in listed:
            panels.setdefault(getattr(cmd, "rich_help_panel", None) or "Commands", []).append(
                (name, cmd.get_short_help_str(limit))
            )
        for panel, rows in panels.items():
            with formatter.section(panel):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=_LaserGroup,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="LASER: fast LLM knowledge generation for recommenders.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"laser {version('laser-knowledge')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("laser (laser-knowledge not installed)")
        raise typer.Exit()


@app.callback()
def main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the laser-knowledge version and exit."
    ),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not sys.stderr.isatty():  # a log file or a pipe gets a progress line every 30 s, not every update
        os.environ.setdefault("TQDM_MININTERVAL", "30")


def _register(module: str, panel: str) -> None:
    """Add a module's commands now, listed under `panel`."""
    commands, groups = len(app.registered_commands), len(app.registered_groups)
    importlib.import_module(module).register(app)
    for info in app.registered_commands[commands:] + app.registered_groups[groups:]:
        info.rich_help_panel = panel


for _module, _panel, _deferred in COMMANDS:
    if _deferred is None:
        _register(_module, _panel)


if __name__ == "__main__":
    app()
