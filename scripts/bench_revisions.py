"""Before/after: the same measurement from two checkouts, run in turn (A B A B ...) in one call, so that
the machine's drift hits both alike. Prints each figure's median per checkout and the ratio, and writes
the JSON.

    # `laser bench decode`: each method's decode-phase tokens/s (model load excluded, prefill included)
    .venv/bin/python scripts/bench_revisions.py BEFORE_DIR AFTER_DIR --rounds 3 --json bench-revisions.json \
        -- --users 3 --max-new-tokens 96
    # a whole job (`laser run CONFIG`, fresh output each run): wall seconds and each pass's rates, from the
    # job's own summary.json; what follows `--` are more `laser run` options
    .venv/bin/python scripts/bench_revisions.py BEFORE_DIR AFTER_DIR --job jobs/configs/demo.yaml \
        --json bench-revisions.json -- --set execution.engine=hf
    # one checkout, two settings: --before-set / --after-set add a side's own `--set KEY=VALUE`
    .venv/bin/python scripts/bench_revisions.py . . --job jobs/configs/demo.yaml --after-set decoder.params.K=0

Each checkout runs with its own code first on the path (the same venv, the machine's caches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(checkout: Path, argv: list[str], env_path: Path) -> None:
    cmd = [sys.executable, "-c", "from jobs.cli import app; app()", *argv]
    subprocess.run(
        cmd,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(env_path)},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def decode_figures(checkout: Path, bench_args: list[str], out: Path) -> dict[str, float]:
    """Each method's tokens/s of one `laser bench decode` run."""
    run_once(checkout, ["bench", "decode", "--json", str(out), *bench_args], checkout)
    return {name: m["tokens_per_s"] for name, m in json.loads(out.read_text())["methods"].items()}


def quality_figures(name: str, quality: dict[str, float]) -> dict[str, float]:
    """A pass's written rows: ended, degenerate and fragment shares and grounding, in percent."""
    keys = {"ended %": "ended_share", "degenerate %": "degenerate_share", "grounding %": "grounding"}
    figures = {
        f"{name} pass {label}": 100 * quality[key] for label, key in keys.items() if quality.get(key) is not None
    }
    if quality.get("n"):
        figures[f"{name} pass fragment %"] = 100 * quality.get("fragment", 0) / quality["n"]
    return figures


def job_figures(checkout: Path, config: Path, run_args: list[str], out: Path) -> dict[str, float]:
    """Whole-job wall seconds, and per pass its wall seconds, decode-only tokens/s, AAL, retries, decoded tokens and
    the written rows' quality (summary.json)."""
    run_once(checkout, ["run", str(config.resolve()), "--set", f"output.path={out}", *run_args], checkout)
    summary = json.loads((out / "summary.json").read_text())
    figures = {"job wall s": summary["wall_s"]}
    for name in ("old", "new"):
        rep = summary.get(name) or {}
        if rep.get("done"):
            figures[f"{name} pass wall s"] = rep["wall_s"]
            figures[f"{name} pass decode tok/s"] = rep.get("tokens_per_s_decode") or 0.0
            figures[f"{name} pass AAL"] = rep["aal"]
            figures[f"{name} pass retries"] = rep.get("retries", 0)
            figures[f"{name} pass decoded tokens"] = rep.get("decoded_tokens", 0)
            figures.update(quality_figures(name, rep.get("quality") or {}))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job", type=Path, default=None, help="a job config: time whole job runs, not `bench decode`")
    ap.add_argument("--before-set", action="append", default=[], help="job: a `--set` of the before side only")
    ap.add_argument("--after-set", action="append", default=[], help="job: a `--set` of the after side only")
    ap.add_argument("--json", type=Path, default=Path("bench-revisions.json"))
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for label, checkout in (("before", args.before), ("after", args.after)):
                out = Path(tmp) / f"{label}-{r}"
                sets = [a for kv in getattr(args, f"{label}_set") for a in ("--set", kv)]
                figures = (
                    job_figures(checkout.resolve(), args.job, extra + sets, out)
                    if args.job
                    else decode_figures(checkout.resolve(), extra, out.with_suffix(".json"))
                )
                runs[label].append(figures)
                print(f"round {r + 1} {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    names = [m for m in runs["after"][0] if all(m in x for x in runs["before"] + runs["after"])]
    table = {
        m: {
            "before": statistics.median(x[m] for x in runs["before"]),
            "after": statistics.median(x[m] for x in runs["after"]),
        }
        for m in names
    }
    print(f"\n{'figure (median)':32s} {'before':>10s} {'after':>10s} {'after/before':>12s}")
    for m, v in table.items():
        ratio = f"{v['after'] / v['before']:12.2f}" if v["before"] else f"{'-':>12s}"
        print(f"{m:32s} {v['before']:10.1f} {v['after']:10.1f} {ratio}")
    args.json.write_text(
        json.dumps(
            {
                "job": str(args.job) if args.job else None,
                "args": extra,
                "rounds": args.rounds,
                "before_set": args.before_set,
                "after_set": args.after_set,
                "runs": runs,
                "median": table,
                "load_avg": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
