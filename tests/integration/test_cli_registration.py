"""How `laser` registers its commands: one `register(app)` per owning module, help panels, and research tools
(`benchmarks`, `training`) loaded only when one of their commands runs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import typer
from typer.testing import CliRunner

from jobs.cli import COMMANDS, app

TOOLS = "sorted(m for m in sys.modules if m.split('.')[0] in ('benchmarks', 'training'))"


def _tools_loaded_after(args: list[str]) -> tuple[int, str]:
    """Exit code of `laser ARGS` in a fresh interpreter, and the tool modules it imported."""
    code = (
        "import sys; from typer.testing import CliRunner; import jobs.cli; "
        f"r = CliRunner().invoke(jobs.cli.app, {args!r}); print(r.exit_code); print({TOOLS})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    return int(out[0]), out[1]


def test_help_and_run_do_not_import_the_tools(tmp_path):
    assert _tools_loaded_after(["--help"]) == (0, "[]")
    assert _tools_loaded_after(["run", "--help"]) == (0, "[]")
    code, tools = _tools_loaded_after(["run", str(tmp_path / "missing.yaml")])
    assert code == 2 and tools == "[]"


def test_a_tool_command_loads_its_package_when_it_runs():
    code, tools = _tools_loaded_after(["bench", "--help"])
    assert code == 0 and "benchmarks.cli" in tools and "training.cli" not in tools
    code, tools = _tools_loaded_after(["train-draft", "--help"])
    assert code == 0 and "training.cli" in tools and "benchmarks.cli" not in tools
    bench = CliRunner().invoke(app, ["bench", "--help"])
    assert bench.exit_code == 0 and "throughput" in bench.output and "scale" in bench.output


def _panels(output: str) -> dict[str, list[str]]:
    """The plain help's sections after Options: panel -> command names."""
    panels: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            panels[current] = []
        elif current and line.startswith("  ") and not line.startswith("   "):
            panels[current].append(line.split()[0])
    panels.pop("Options", None)
    panels.pop("Usage", None)
    return panels


def test_help_lists_every_command_once_under_its_panel():
    panels = _panels(CliRunner().invoke(app, ["--help"], terminal_width=120).output)
    assert list(panels) == ["Job", "Operations", "Research"]
    assert {"run", "demo", "generate", "submit", "recommend"} <= set(panels["Job"])
    assert {"latest", "encode", "ingest", "failures", "decoders"} <= set(panels["Operations"])
    assert set(panels["Research"]) == {
        "ctr-eval",
        "bench",
        "train-draft",
        "train-recommender",
        "train-align",
        "train-redrafter",
    }
    listed = [name for names in panels.values() for name in names]
    assert len(listed) == len(set(listed))


def test_the_deferred_help_matches_the_modules():
    """The one-line help jobs/cli.py shows for an unloaded command is its module's, and names all its commands."""
    for module, _panel, deferred in COMMANDS:
        if deferred is None:
            continue
        sub = typer.Typer(rich_markup_mode=None)
        importlib.import_module(module).register(sub)
        commands = typer.main.get_group(sub).commands
        assert set(commands) == set(deferred), module
        for name, short_help in deferred.items():
            assert commands[name].get_short_help_str(1000) == short_help, name
