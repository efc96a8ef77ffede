"""Check LASER's vLLM plug-in against vLLM wheels without installing them: each version's wheel is
downloaded from the package index (once, into a cache folder) and its source read from the archive
(laser.vllm.requirements: the same checks the plug-in runs when vLLM loads it).

    python scripts/check_vllm_wheel.py 0.26.0 0.33.0 [--wheel PATH ...] [--json docs/results/vllm-wheels.json]

Prints one row per version (passes, what is missing, which optional features it has) and exits 1 if any
version misses a need.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from laser.vllm.requirements import Report, check, wheel_source

CACHE = Path.home() / ".cache" / "laser" / "vllm-wheels"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def download(version: str, cache: Path = CACHE) -> Path:
    """The x86_64 Linux wheel of vLLM ``version`` (no dependencies), downloaded into ``cache`` unless there."""
    found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:"]
    cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd += ["--python-version", "3.11", "--dest", str(cache), "--quiet"]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"pip could not download a vllm {version} x86_64 wheel (see its message above)")
    found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no vllm {version} x86_64 wheel into {cache}")
    return found[0]


def as_json(report: Report, wheel: Path) -> dict[str, object]:
    return {
        "version": report.version,
        "wheel": wheel.name,
        "ok": report.ok,
        "tested_range": report.tested,
        "missing": report.missing,
        "features": report.features,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="vLLM versions to download and check")
    ap.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel already on disk")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    wheels = [download(v, args.cache) for v in args.versions] + list(args.wheel)
    if not wheels:
        ap.error("name a version or a --wheel")
    reports = [(w, check(wheel_source(w))) for w in wheels]
    table = Table("vLLM", "plug-in's needs", "missing", *reports[0][1].features)
    for _, r in reports:
        found = "all found" if r.ok else "MISSING"
        table.add_row(
            r.version, found, "; ".join(r.missing) or "-", *("yes" if v else "no" for v in r.features.values())
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"checked": [as_json(r, w) for w, r in reports]}, indent=2) + "\n")
    sys.exit(0 if all(r.ok for _, r in reports) else 1)


if __name__ == "__main__":
    main()
