"""docs/job-config.md says it lists every key: each job config key must appear there (a new key without a
line in the page fails here)."""

from __future__ import annotations

from pathlib import Path

from pipelines.config import JobConfig

DOC = (Path(__file__).resolve().parents[2] / "docs" / "job-config.md").read_text()


def _listed(section: str, key: str) -> bool:
    """``section.key`` in the job keys table, or ``key`` in a row that names its section (a grouped row:
    ``generation.repetition_penalty``, ``no_repeat_ngram_size``, ...); dataset keys in their own table."""
    if section == "dataset":
        part = DOC.split("## `dataset`", 1)[1].split("\n## ", 1)[0]
        return f"`{key}" in part or f"`{key}." in part
    rows = [line for line in DOC.splitlines() if line.startswith(f"| `{section}.")]
    return any(f"`{section}.{key}`" in r or f", `{key}`" in r or f"`{section}.{key}." in r for r in rows)


def test_every_job_config_key_is_in_the_config_page():
    missing = [
        f"{section}.{key}"
        for section, field in JobConfig.model_fields.items()
        for key in getattr(field.annotation, "model_fields", {})
        if not _listed(section, key)
    ]
    assert not missing, f"docs/job-config.md lacks {missing}"
