"""Before/after: `laser bench decode` from two checkouts, run in turn (A B A B ...) in one call, so that
the machine's drift hits both alike. Prints each method's median tokens/s per checkout and the ratio,
and writes the JSON.

    .venv/bin/python scripts/bench_revisions.py BEFORE_DIR AFTER_DIR --rounds 3 --json bench-revisions.json \
        -- --users 3 --max-new-tokens 96

Each checkout runs with its own code first on the path (the same venv). Figures are the bench's own
decode-phase tokens/s (model load excluded, prefill included, as `laser bench decode` reports them).
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


def run_once(checkout: Path, bench_args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-c", "from jobs.cli import app; app()", "bench", "decode", "--json", str(out), *bench_args]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def tokens_per_s(result: dict) -> dict[str, float]:
    return {name: m["tokens_per_s"] for name, m in result["methods"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=Path("bench-revisions.json"))
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, bench_args = ap.parse_args(argv[:cut]), argv[cut + 1:]
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for label, checkout in (("before", args.before), ("after", args.after)):
                res = run_once(checkout.resolve(), bench_args, Path(tmp) / f"{label}-{r}.json")
                runs[label].append(tokens_per_s(res))
                print(f"round {r + 1} {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[label][-1].items()),
                      flush=True)
    methods = list(runs["after"][0])
    table = {m: {"before": statistics.median(x[m] for x in runs["before"] if m in x),
                 "after": statistics.median(x[m] for x in runs["after"])} for m in methods
             if any(m in x for x in runs["before"])}
    print(f"\n{'method':28s} {'before tok/s':>12s} {'after tok/s':>12s} {'after/before':>12s}")
    for m, v in table.items():
        print(f"{m:28s} {v['before']:12.1f} {v['after']:12.1f} {v['after'] / v['before']:12.2f}")
    args.json.write_text(json.dumps({"bench_args": bench_args, "rounds": args.rounds, "runs": runs,
                                     "median": table, "load_avg": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
