"""Clean command-line errors: bad input prints one red line and exits 2, never a traceback."""
from __future__ import annotations

import functools
from typing import Any, Callable

import typer

EXIT_BAD_INPUT = 2


def input_error_types() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the input is wrong": bad config, decoder, parameter, missing or bad data file."""
    from pipelines.config import ConfigError
    from pipelines.data.readers import DataFileError
    from pipelines.validation import JobInputError

    return ConfigError, JobInputError, DataFileError, FileNotFoundError


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a typer command: an input error becomes its one-line message on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except input_error_types() as exc:
            message = exc.args[0] if isinstance(exc, FileNotFoundError) and exc.args else exc
            typer.secho(str(message), fg=typer.colors.RED, err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper
