"""Every file of the repository the README and the docs name exists (a moved test or a renamed module breaks
this test, not a reader's trust)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = "tests|pipelines|laser|pools|router|jobs|benchmarks|training|docs|examples|scripts|results"
SUFFIXES = "py|md|yaml|yml|json|png|j2|sh|toml"
PATH = re.compile(rf"(?<![\w/.-])((?:\.\./)?(?:{ROOMS})/[\w./-]*\w\.(?:{SUFFIXES}))(?![\w/])")


def _missing(doc: Path) -> list[str]:
    """Paths ``doc`` names that exist neither from the repository's root nor from the doc's folder (nor under
    docs/, for a link text that names a result by its path below docs/)."""
    found = []
    for ref in {m.group(1) for m in PATH.finditer(doc.read_text())}:
        if "*" in ref or "<" in ref:
            continue
        if not any(p.exists() for p in (ROOT / ref, doc.parent / ref, ROOT / "docs" / ref)):
            found.append(ref)
    return sorted(found)


LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")  # a Markdown link's target, without its anchor
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_link_between_docs_resolves():
    broken = {
        str(d.relative_to(ROOT)): targets
        for d in DOCS
        if (targets := [t for t in LINK.findall(d.read_text()) if ":" not in t and not (d.parent / t).exists()])
    }
    assert not broken, f"links to files that are not there (relative to the linking page): {broken}"


def test_every_path_the_docs_name_exists():
    docs = DOCS
    missing = {str(d.relative_to(ROOT)): refs for d in docs if (refs := _missing(d))}
    assert not missing, f"docs name files that are not in the repository: {missing}"
