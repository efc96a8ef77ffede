"""Every file of the repository the README and the docs name exists (a moved test or a renamed module breaks
this test, not a reader's trust): paths under the repository's folders, folders named in backticks, modules
named with an attribute (`tests/helpers.local_s3`), tests named by node id (`tests/x.py::test_y`), and the
targets of Markdown links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = "tests|pipelines|laser|pools|router|jobs|benchmarks|training|docs|examples|scripts|results"
SUFFIXES = "py|md|yaml|yml|json|png|j2|sh|toml|txt|log|csv|parquet|cfg|ini"
PATH = re.compile(rf"(?<![\w/.-])((?:\.\./)?(?:{ROOMS})/[\w./-]*\w\.(?:{SUFFIXES}))(?![\w/])")
# a folder in backticks: `pipelines/store/`
FOLDER = re.compile(rf"`((?:\.\./)?(?:{ROOMS})/[\w./-]*/)`")
# a module and one of its attributes in backticks: `tests/helpers.local_s3`, `tests/helpers.save_tiny_model(...)`
MODULE = re.compile(rf"`((?:{ROOMS})/[\w/]*\w)\.(?!(?:{SUFFIXES})\b)[A-Za-z_]\w*")
# a test by node id: `tests/unit/test_x.py::test_y`
NODE = re.compile(r"((?:tests)/[\w/]+\.py)::(\w+)")


def _exists(doc: Path, ref: str) -> bool:
    """``ref`` from the repository's root, from the doc's folder, or under docs/ (a link text that names a
    result by its path below docs/)."""
    return any(p.exists() for p in (ROOT / ref, doc.parent / ref, ROOT / "docs" / ref))


def _missing(doc: Path) -> list[str]:
    """Repository paths ``doc`` names that are not there."""
    text = doc.read_text()
    refs = {m.group(1) for m in PATH.finditer(text)} | {m.group(1) for m in FOLDER.finditer(text)}
    found = [r for r in refs if "*" not in r and "<" not in r and not _exists(doc, r)]
    found += [f"{m}.py" for m in {m.group(1) for m in MODULE.finditer(text)} if not _exists(doc, f"{m}.py")]
    for path, name in set(NODE.findall(text)):
        source = ROOT / path
        if source.exists() and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", source.read_text(), re.M):
            found.append(f"{path}::{name}")
    return sorted(set(found))


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
    missing = {str(d.relative_to(ROOT)): refs for d in DOCS if (refs := _missing(d))}
    assert not missing, f"docs name files that are not in the repository: {missing}"


def test_a_made_up_path_is_caught(tmp_path):
    """The check can fail: a page naming files, folders, modules and tests that do not exist is reported."""
    page = tmp_path / "page.md"
    page.write_text(
        "The store is `pipelines/storage.py` (see pipelines/sharded_store.py), tested in "
        "`tests/unit/test_no_such_thing.py`; its folder `pipelines/no_such_room/`; the helper "
        "`tests/no_helpers.local_s3`; the test `tests/unit/test_docs_paths.py::test_no_such_test`. "
        "Real ones pass: `pipelines/store/`, `tests/helpers.local_s3`, "
        "`tests/unit/test_docs_paths.py::test_a_made_up_path_is_caught`, `pipelines/store/knowledge.py`."
    )
    assert _missing(page) == [
        "pipelines/no_such_room/",
        "pipelines/sharded_store.py",
        "pipelines/storage.py",
        "tests/no_helpers.py",
        "tests/unit/test_docs_paths.py::test_no_such_test",
        "tests/unit/test_no_such_thing.py",
    ]
