"""Clean command-line endings: bad input prints one red line and exits 2, never a traceback; SIGINT or
SIGTERM keeps the rows already generated, says what was kept and how to resume, and exits 130 or 143."""
from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import typer

EXIT_BAD_INPUT = 2


def input_error_types() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the input is wrong": bad config, decoder, parameter, output URI, missing or bad data file."""
    from pipelines.config import ConfigError
    from pipelines.data.readers import DataFileError
    from pipelines.storage import StorageError
    from pipelines.knowledge.validation import JobInputError

    return ConfigError, JobInputError, DataFileError, StorageError, FileNotFoundError


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a typer command: an input error becomes its one-line message on stderr and exit code 2."""
    from pipelines.interrupts import JobInterrupted, catch_signals

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with catch_signals():
                return fn(*args, **kwargs)
        except JobInterrupted as exc:
            typer.secho(interrupt_report(exc.args[0], kwargs), fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(exc.exit_code) from None
        except input_error_types() as exc:
            message = exc.args[0] if isinstance(exc, FileNotFoundError) and exc.args else exc
            typer.secho(str(message), fg=typer.colors.RED, err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper


def interrupt_report(signal_name: str, kwargs: dict[str, Any]) -> str:
    """What an interrupted command kept (rows per knowledge store) and the command that resumes it."""
    from jobs.config import bundled_config, load_config
    from pipelines.knowledge.paths import JobPaths
    from pipelines.knowledge_store import done_keys

    lines = [f"interrupted by {signal_name}: the rows already generated were flushed to disk"]
    try:
        cfg = load_config(kwargs.get("config") or bundled_config("demo"), kwargs.get("set_") or [])
        paths = JobPaths.of(cfg)
        for label, store in (("new knowledge", paths.knowledge), ("old knowledge", paths.old_knowledge)):
            lines.append(f"  kept {len(done_keys(store))} {label} rows in {store}")
    except Exception as exc:  # the report must not hide the interruption
        lines.append(f"  (could not count the kept rows: {exc})")
    prog = Path(sys.argv[0]).name
    prog = "python -m jobs.cli" if prog in ("cli.py", "__main__.py") else prog
    command = " ".join([prog, shlex.join(sys.argv[1:])])
    lines.append(f"resume with the same command (written entities are skipped): {command}")
    return "\n".join(lines)
