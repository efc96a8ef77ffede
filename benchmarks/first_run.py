"""`laser bench first-run`: a job's first run on the same tables under two configs, side by side.

What a default is chosen from: whole `laser run --incremental` jobs (fresh processes, fresh outputs, warm
caches), the configs alternating A, B, B, A, ... so that drift of a shared machine falls on both. Each run
reports its wall, its time account (start-up, driver steps, prefill, first decode, retries, writing), decode
tok/s, AAL and retries, and its texts' quality; the ratio is of the median walls (B / A: above 1, A is faster).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.refresh import print_time, run_once, text_quality


def run_first_run_bench(
    json_out: Path,
    config: Path,
    dataset: Any,
    work: Path,
    overrides: list[str],
    a: list[str],
    b: list[str],
    repeats: int = 2,
) -> dict[str, Any]:
    """First runs of ``config`` with ``a`` and with ``b`` (overrides on top of ``overrides``), ``repeats``
    each, alternating; prints a table, writes ``json_out`` and a stacked bar of the time accounts beside it."""
    from benchmarks.incremental import write_tables
    from benchmarks.refresh import plot_time
    from benchmarks.report import machine_info, save_report, versions
    from pipelines.store.knowledge import read_knowledge

    if work.exists() and any(work.iterdir()):
        raise FileExistsError(f"{work}: not empty; pass a fresh --work directory")
    load_before = machine_info()["load_average"]
    base = list(overrides) + write_tables(dataset, work / "data")
    runs: dict[str, dict[str, Any]] = {}
    quality: dict[str, dict[str, Any]] = {}
    for i in range(repeats):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            name = f"{side}{i}"
            out = work / name
            runs[name] = run_once(f"first-{name}", config, base + (a if side == "a" else b), out, json_out.parent)
            quality[name] = text_quality(read_knowledge(out / "knowledge"))
    walls = {s: [r["wall_s"] for n, r in runs.items() if n.startswith(s)] for s in ("a", "b")}
    result = {
        "config": str(config),
        "overrides": overrides,
        "a": a,
        "b": b,
        "runs": runs,
        "quality": quality,
        "median_wall_s": {s: statistics.median(w) for s, w in walls.items()},
        "b_over_a": statistics.median(walls["b"]) / statistics.median(walls["a"]),
        "load_average_before": load_before,
        "machine": machine_info(),
        "versions": versions(),
    }
    save_report(result, json_out)
    plot_time(runs, json_out.with_suffix(".png"))
    print_first_runs(result)
    return result


def print_first_runs(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"first runs: A = {' '.join(result['a'])}; B = {' '.join(result['b'])}")
    for col in ("run", "wall s", "fixed s", "tok/s decode", "AAL", "retries", "decoded tokens", "ended", "degenerate"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for name, r in result["runs"].items():
        q = result["quality"][name]
        table.add_row(
            name,
            f"{r['wall_s']:.1f}",
            f"{r['time']['fixed_s']:.1f}" if r.get("time") else "-",
            f"{r['tok_s_decode']:.1f}",
            f"{r['aal']:.2f}",
            str(r["retries"]),
            str(r["decoded_tokens"]),
            f"{q['ended_share']:.0%}" if q["ended_share"] is not None else "-",
            f"{q['degenerate_share']:.0%}" if q["degenerate_share"] is not None else "-",
        )
    console = Console()
    console.print(table)
    print_time(result, console)
    med = result["median_wall_s"]
    console.print(f"median wall: A {med['a']:.1f} s, B {med['b']:.1f} s; B / A = {result['b_over_a']:.2f}")
