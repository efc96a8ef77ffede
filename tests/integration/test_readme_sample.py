"""The README's code runs as written: its decoding-core sample on the bundled model, and its polars
snippet on a knowledge store written here."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from tests.helpers import knowledge_row

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(heading: str) -> str:
    """The first ```python block under ``heading`` in the README."""
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"no python block under '{heading}'"
    return found.group(1)


def test_the_decoding_core_sample_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(_block("Decoding core"), "README.md", "exec"), namespace)
    outs, out = namespace["outs"], namespace["out"]
    assert [o.text for o in outs] == [out.text, out.text]  # greedy: the batch writes the same text
    assert out.stats.finish_reason in ("eos", "length") and capsys.readouterr().out.strip()


def test_the_output_snippet_reads_the_latest_view(tmp_path, monkeypatch):
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    rows = [knowledge_row(i, entity_type="user" if i % 2 else "item") for i in range(4)]
    pl.DataFrame(rows).write_delta(tmp_path / "runs" / "demo" / "latest")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(_block("What the job writes"), "README.md", "exec"), namespace)
    profiles = namespace["profiles"]
    assert isinstance(profiles, pl.DataFrame) and profiles.columns == ["entity_id", "knowledge"]
    assert profiles.height == 2
