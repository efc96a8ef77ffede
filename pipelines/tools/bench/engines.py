"""`laser bench engines`: the job's entities per minute on each engine (``execution.engine: hf | vllm``).

The job config (the demo job by default) runs once per engine and repeat, interleaved, each time in a
fresh process on an empty output (``python -m jobs run CONFIG --set execution.engine=E``). Three figures
per run, from the process's wall clock and the job's ``summary.json``:

- **job**: entities (old and new knowledge) per minute of the whole process: imports, Ray start, actor
  start and model load (vLLM's engine start included), routing, pools, generation, writing;
- **old pass** and **new pass**: entities per minute of each generation pass (the actors are shared by
  the job's passes, so the old pass pays their start and the new pass does not).

Prints a table, writes JSON and Markdown (the median run of each engine), and stamps each run's output
with the seconds since its start (``engines-<engine>-<i>.log`` beside the JSON).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENGINES = ("hf", "vllm")


def timed_job(config: Path, engine: str, out: Path, log_path: Path) -> dict[str, Any]:
    """One full run of the job on ``engine`` in a fresh process: wall seconds and the summary's passes."""
    cmd = [sys.executable, "-m", "jobs", "run", str(config), "--set", f"execution.engine={engine}",
           "--set", f"output.path={out}"]
    start = time.perf_counter()
    with open(log_path, "w") as fh, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True) as proc:
        for line in proc.stdout:
            fh.write(f"{time.perf_counter() - start:7.1f}s {line}")
        code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"the {engine} run exited {code}; see {log_path}")
    summary = json.loads((out / "summary.json").read_text())
    passes = {name: _pass(summary[name]) for name in ("old", "new")}
    entities = passes["old"]["entities"] + passes["new"]["entities"]
    return {"engine": engine, "wall_s": wall, "entities": entities, "entities_per_min": 60 * entities / wall,
            **passes}


def _pass(rep: dict[str, Any]) -> dict[str, Any]:
    done, wall = int(rep["done"]), float(rep["wall_s"])
    return {"entities": done, "failed": int(rep["failed"]), "wall_s": wall, "tokens": int(rep["n_tokens"]),
            "entities_per_min": 60 * done / wall if wall else 0.0, "tokens_per_s": float(rep["tokens_per_s_wall"]),
            "aal": float(rep["aal"])}


def run_engines_bench(json_out: Path, config: Path, work: Path, engines: tuple[str, ...] = ENGINES,
                      repeats: int = 1) -> dict[str, Any]:
    """Every engine ``repeats`` times, interleaved; prints the table, writes ``json_out`` and Markdown."""
    from pipelines.tools.bench.report import machine_info, versions

    json_out.parent.mkdir(parents=True, exist_ok=True)
    load_before = machine_info()["load_average"]
    runs: list[dict[str, Any]] = []
    for i in range(repeats):
        for engine in engines:
            out = work / f"{engine}-{i}"
            if out.exists():
                raise FileExistsError(f"{out}: not empty; pass a fresh --work directory")
            runs.append(timed_job(config, engine, out, json_out.parent / f"engines-{engine}-{i}.log"))
    median = {e: _median_run([r for r in runs if r["engine"] == e]) for e in engines}
    result = {"config": str(config), "repeats": repeats, "runs": runs, "median": median,
              "load_average_before": load_before, "machine": machine_info(), "versions": versions()}
    json_out.write_text(json.dumps(result, indent=1, default=str))
    json_out.with_suffix(".md").write_text(markdown(result))
    print_result(result)
    return result


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose whole-job wall time is the median of the engine's runs."""
    walls = sorted(r["wall_s"] for r in runs)
    mid = statistics.median_low(walls)
    return next(r for r in runs if r["wall_s"] == mid)


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for engine, r in result["median"].items():
        rows.append([engine, f"{r['entities']}", f"{r['wall_s']:.1f}", f"{r['entities_per_min']:.1f}",
                     f"{r['old']['entities_per_min']:.1f}", f"{r['new']['entities_per_min']:.1f}",
                     f"{r['new']['tokens_per_s']:.1f}", f"{r['new']['aal']:.2f}"])
    return rows


COLUMNS = ["engine", "entities", "job wall s", "job entities/min", "old pass entities/min",
           "new pass entities/min", "new pass tok/s", "new pass AAL"]


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Entities per minute by engine ({result['config']})", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(result)]
    m = result["machine"]
    lines += ["", f"Median of {result['repeats']} interleaved run(s) per engine, each a fresh process on an empty "
              "output. Job figures include imports, Ray start, actor start and model load (vLLM's engine start), "
              "routing, pools and writing; the old pass pays the actors' start, the new pass does not.",
              f"Machine: {m.get('cpu_count')} CPUs; load average before {result['load_average_before']}, "
              f"after {m.get('load_average')}.", ""]
    return "\n".join(lines)


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"entities per minute by engine ({result['config']})")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "engine" else "right")
    for row in _rows(result):
        table.add_row(*row)
    Console().print(table)
