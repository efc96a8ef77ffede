"""A command that needs an optional extra names it in one line (exit 1) instead of a traceback."""

from __future__ import annotations

import sys

import pytest
import typer
from typer.testing import CliRunner

from jobs.errors import clean_errors, missing_extra


def _app(module: str) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @clean_errors
    def needs() -> None:
        __import__(module)

    return app


@pytest.mark.parametrize(
    "module, extra", [("peft", "research"), ("matplotlib.pyplot", "research"), ("feast", "features")]
)
def test_a_missing_optional_module_names_its_extra(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module.split(".")[0], None)  # import raises ModuleNotFoundError
    res = CliRunner().invoke(_app(module), [])
    assert res.exit_code == 1 and f"pip install 'laser-knowledge[{extra}]'" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_another_missing_module_is_a_bug_not_an_extra():
    assert missing_extra(ModuleNotFoundError("x", name="no_such_module")) is None
    res = CliRunner().invoke(_app("no_such_module_here"), [])
    assert isinstance(res.exception, ModuleNotFoundError)
