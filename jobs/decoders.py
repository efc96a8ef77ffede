"""CLI command `laser decoders`: the registered decoders. Registered on the `laser` app by :mod:`jobs.cli`."""

from __future__ import annotations

import typer


def decoders() -> None:
    """List the registered decoders (built-ins and `laser.decoders` entry-point plug-ins)."""
    from laser import available_decoders

    for name, cls in available_decoders().items():
        typer.echo(f"{name:16s} pool={cls.pool:7s} {cls.summary}")


def register(app: typer.Typer) -> None:
    app.command("decoders")(decoders)
