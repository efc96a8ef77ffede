"""`laser bench incremental`: wall time of an incremental run where a share of users changed, vs the full run.

The job config (the demo job by default) is run twice as a scheduler would run it, each time in a fresh
process (``python -m jobs run CONFIG --incremental``: imports, Ray start and model load included):

1. **full**: an empty output; every entity is generated (old knowledge, routing, pools, new knowledge);
2. **incremental**: after the newest rating of ``share`` of the users with knowledge is edited in place
   (the entities a feed of rating changes would touch), the same command again.

The dataset is saved as Parquet tables first (format ``table``), so the benchmark can edit it. Prints a
table and writes JSON (times, the ledger's counts per run, machine and load average) and each run's
output with every line stamped by the seconds since its start (``incremental-<run>.log`` beside the
JSON); the target of the operations issue is incremental <= 20% of full.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

log = logging.getLogger(__name__)

TARGET_RATIO = 0.20


@dataclass
class TimedRun:
    """One `laser run --incremental` process: its wall seconds, exit code and ledger row."""

    name: str
    wall_s: float
    exit_code: int
    ledger: dict[str, Any]


def write_tables(dataset: Any, data_dir: Path) -> list[str]:
    """Save the job's dataset (its ``DatasetConfig``, any trial sample applied) as Parquet tables; the overrides
    that point the job at them (and take them whole: the sample is not drawn again)."""
    from pipelines.data.load import load_dataset

    ds = load_dataset(dataset)
    data_dir.mkdir(parents=True, exist_ok=True)
    for name in ("interactions", "items", "users"):
        getattr(ds, name).write_parquet(data_dir / f"{name}.parquet")
    return [
        "dataset.format=table",
        f"dataset.path={data_dir}",
        "dataset.interactions_file=interactions.parquet",
        "dataset.items_file=items.parquet",
        "dataset.users_file=users.parquet",
        f"dataset.name={ds.name}",
        f"dataset.domain={ds.domain}",
        "dataset.limit_users=null",
        "dataset.limit_items=null",
    ]


def edit_users(data_dir: Path, users: list[str]) -> None:
    """Flip the newest rating of each listed user in place (high -> 1, low -> 5; timestamp unchanged)."""
    path = data_dir / "interactions.parquet"
    inter = pl.read_parquet(path)
    newest = pl.col("timestamp") == pl.col("timestamp").max().over("user_id")
    flipped = pl.when(pl.col("rating") >= 3).then(1.0).otherwise(5.0).cast(inter.schema["rating"])
    inter.with_columns(
        rating=pl.when(pl.col("user_id").is_in(users) & newest).then(flipped).otherwise(pl.col("rating"))
    ).write_parquet(path)


def pick_users(knowledge: pl.DataFrame, share: float, seed: int) -> list[str]:
    """A seeded ``share`` (at least one) of the users that have new knowledge."""
    users = sorted(knowledge.filter(pl.col("entity_type") == "user")["entity_id"].unique().to_list())
    if not users:
        raise RuntimeError("the full run wrote no user knowledge; nothing to change")
    n = max(1, round(share * len(users)))
    return sorted(np.random.default_rng(seed).choice(users, size=n, replace=False).tolist())


def timed_run(name: str, config: Path, overrides: list[str], out: Path, log_dir: Path) -> TimedRun:
    """Run the job once incrementally in a fresh process; its wall time and its ledger row."""
    from pipelines.ops.schedule.ledger import RunLedger

    cmd = [sys.executable, "-m", "jobs", "run", str(config), "--incremental"]
    for item in overrides:
        cmd += ["--set", item]
    log_path = log_dir / f"incremental-{name}.log"
    start = time.perf_counter()
    with (
        open(log_path, "w") as fh,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ)
        ) as proc,
    ):
        if proc.stdout is None:
            raise RuntimeError(f"{name}: the job's output pipe did not open")
        for line in proc.stdout:  # each line stamped with the seconds since start: where the run's time goes
            fh.write(f"{time.perf_counter() - start:7.1f}s {line}")
        code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{name} run exited {code}; see {log_path}")
    rec = RunLedger(out).records()[-1]
    row = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in rec.__dict__.items()}
    return TimedRun(name, wall, code, row)


def run_incremental_bench(
    json_out: Path, config: Path, dataset: Any, work: Path, share: float = 0.1, seed: int = 0
) -> dict[str, Any]:
    """Full run, edit ``share`` of the users, incremental run; prints a table, writes ``json_out``.
    ``dataset`` is the config's ``DatasetConfig`` (loaded by the caller)."""
    from benchmarks.report import machine_info, save_report, versions
    from pipelines.store.knowledge import read_knowledge

    out = work / "out"
    if out.exists():
        raise FileExistsError(f"{out}: not empty; pass a fresh --work directory")
    overrides = write_tables(dataset, work / "data") + [f"output.path={out}"]
    json_out.parent.mkdir(parents=True, exist_ok=True)
    load_before = machine_info()["load_average"]
    full = timed_run("full", config, overrides, out, json_out.parent)
    changed = pick_users(read_knowledge(out / "knowledge"), share, seed)
    edit_users(work / "data", changed)
    inc = timed_run("incremental", config, overrides, out, json_out.parent)
    ratio = inc.wall_s / full.wall_s
    result = {
        "config": str(config),
        "share": share,
        "seed": seed,
        "changed_users": changed,
        "full": full.__dict__,
        "incremental": inc.__dict__,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO,
        "load_average_before": load_before,
        "machine": machine_info(),
        "versions": versions(),
    }
    save_report(result, json_out)
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"incremental vs full run ({len(result['changed_users'])} users changed)")
    for col in ("run", "wall s", "generated", "new", "changed", "unchanged", "old generated"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for name in ("full", "incremental"):
        r, led = result[name], result[name]["ledger"]
        table.add_row(
            name,
            f"{r['wall_s']:.1f}",
            str(led["generated"]),
            str(led["entities_new"]),
            str(led["entities_changed"]),
            str(led["entities_unchanged"]),
            str(led["old_generated"]),
        )
    Console().print(table)
    verdict = "met" if result["met"] else "missed"
    Console().print(
        f"incremental / full = {result['ratio']:.3f} ({verdict}: target <= {result['target_ratio']:.2f}); "
        f"load average {result['machine']['load_average']}"
    )
