"""`laser bench refresh`: a scheduled sequence as a team runs it, drafting on and off, side by side.

Every run is ``python -m jobs run CONFIG --incremental`` in a fresh process (imports, Ray start and model
load included), on the config's dataset saved as Parquet tables:

1. **day 1, drafting**: an empty output, every entity generated with the config's decoder (a first run:
   no earlier knowledge, so groups go in two waves: pipelines/knowledge/job.py);
2. **day 1, no drafting**: the same on another empty output with ``decoder.name=autoregressive``;
3. the data of day 2: one new interaction (an unseen item, after every other) for ``users`` users with at
   least ``min_history`` interactions, and one new item (a copy of an existing item's attributes);
4. **day 2, drafting**: the refresh on day 1's output (each changed entity drafts from its own earlier
   text first, then its group's pool);
5. **day 2, no drafting**: the same refresh on a copy of day 1's output taken before step 4, with
   ``decoder.name=autoregressive --keep-existing`` (so only the changed entities are decoded there too).

Steps 4 and 5 run ``--repeats`` times each (fresh copies of day 1's output, the order alternating);
the day 2 ratio is of the medians. Day 1 as it was (data, output, figures) is kept under ``<work>/day1``; ``--day1-from WORK`` runs only
day 2 again from an earlier work directory's day 1.

Prints a table and writes JSON: per run the wall seconds, entities per minute, the ledger's counts and the
new-knowledge pass's figures from ``summary.json`` (``tok/s decode``: engine steps with no prefill;
AAL; accepted drafts per step; the share of them from the entities' own earlier texts), the checks that
day 2 regenerated exactly the changed users and the new item and that their texts changed, and the
ratios (day 2 decode tok/s drafting / no drafting, target >= 1.5; day 1 entities per minute, target >= 1.1).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.incremental import write_tables

TARGET_REFRESH = 1.5  # day 2 decode tok/s, drafting over no drafting
TARGET_FIRST = 1.1  # day 1 entities per minute, drafting over no drafting
PLAIN = ["decoder.name=autoregressive", "decoder.params={}"]


def run_once(
    name: str, config: Path, overrides: list[str], out: Path, log_dir: Path, flags: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One scheduled run in a fresh process: wall seconds, its ledger row and its summary.json."""
    from pipelines.ops.schedule.ledger import RunLedger

    cmd = [sys.executable, "-m", "jobs", "run", str(config), "--incremental", *flags]
    for item in overrides + [f"output.path={out}"]:
        cmd += ["--set", item]
    log_path = log_dir / f"refresh-{name}.log"
    start = time.perf_counter()
    with open(log_path, "w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ)).returncode
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{name} run exited {code}; see {log_path}")
    rec = RunLedger(out).records()[-1]
    summary = json.loads((out / "summary.json").read_text())
    new = summary["new"]
    done = rec.generated
    return {
        "wall_s": wall,
        "entities_per_min": 60 * done / wall if wall else 0.0,
        "generated": done,
        "new": rec.entities_new,
        "changed": rec.entities_changed,
        "unchanged": rec.entities_unchanged,
        "failed": rec.failed,
        "run_id": rec.run_id,
        "tok_s_decode": new["tokens_per_s_decode"],
        "aal": new["aal"],
        "accepted_per_step": (new["aal"] - 1) if new["aal"] else 0.0,
        "own_share": new.get("own_share"),
        "own_accepted": new.get("own_accepted", 0),
        "decoded_tokens": new["decoded_tokens"],
        "retries": new.get("retries", 0),
        "time": summary.get("time"),  # the run's time account (pipelines/knowledge/time_account.py)
        "log": str(log_path),
    }


def day_two(data: Path, users: int, min_history: int, seed: int) -> tuple[list[str], str]:
    """Edit the tables for day 2; returns the changed users and the new item's id."""
    inter_path, items_path = data / "interactions.parquet", data / "items.parquet"
    inter, items = pl.read_parquet(inter_path), pl.read_parquet(items_path)
    heavy = (
        inter.group_by("user_id")
        .len()
        .filter(pl.col("len") >= min_history)
        .sample(fraction=1.0, shuffle=True, seed=seed)["user_id"]
        .head(users)
        .sort()
        .to_list()
    )
    if len(heavy) < users:
        raise RuntimeError(f"only {len(heavy)} users have {min_history}+ interactions; asked for {users}")
    latest = inter["timestamp"].max()
    if not isinstance(latest, (int, float)):
        raise ValueError(f"{inter_path}: column timestamp has no numeric maximum (got {latest!r})")
    t = int(latest) + 3600
    counts = inter.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])["item_id"].to_list()
    counts += sorted(set(items["item_id"].to_list()) - set(counts))  # then the items nobody rated
    added = []
    for k, user in enumerate(heavy):  # the most popular item the user has not seen
        seen = set(inter.filter(pl.col("user_id") == user)["item_id"].to_list())
        item = next(i for i in counts if i not in seen)
        added.append({"user_id": user, "item_id": item, "rating": 5.0, "timestamp": t + k})
    pl.concat([inter, pl.DataFrame(added, schema=inter.schema)]).write_parquet(inter_path)
    new_id = "bench-new-item"
    pl.concat(
        [items, items.head(1).with_columns(item_id=pl.lit(new_id, dtype=items.schema["item_id"]))],
        how="vertical_relaxed",
    ).write_parquet(items_path)
    return heavy, new_id


def text_quality(rows: pl.DataFrame) -> dict[str, Any]:
    """How a run's texts read (pipelines/quality/ columns): rows, the share ended (by EOS or at a sentence
    end), degenerate, and grounding (mean over rows that mention facts)."""
    grounded = rows["grounding"].drop_nulls()
    return {
        "rows": rows.height,
        "ended_share": rows["ended"].mean() if rows.height else None,
        "degenerate_share": rows["degenerate"].mean() if rows.height else None,
        "grounding": grounded.mean() if grounded.len() else None,
    }


def run_quality(work: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """:func:`text_quality` of each run's rows, read from its output."""
    from pipelines.store.knowledge import read_knowledge

    outs = {
        "day1_plain": "plain",
        "day1_laser": "day1/laser",
        "day2_laser": "laser",
        "day2_plain": "laser-then-plain-0",
    }
    return {
        name: text_quality(
            read_knowledge(work / outs[name] / "knowledge").filter(pl.col("run_id") == runs[name]["run_id"])
        )
        for name in runs
        if (work / outs[name]).exists()
    }


def run_refresh_bench(
    json_out: Path,
    config: Path,
    dataset: Any,
    work: Path,
    users: int = 50,
    min_history: int = 100,
    seed: int = 0,
    overrides: list[str] | None = None,
    day1_from: Path | None = None,
    day2_repeats: int = 3,
) -> dict[str, Any]:
    """The sequence of the module docstring; prints a table and writes ``json_out``. ``dataset`` is the
    config's ``DatasetConfig`` (loaded by the caller with ``overrides``, which every run also gets).
    ``day1_from``: the work directory of an earlier run of this bench, whose day 1 (data, output and figures)
    is taken as it was, so only day 2 runs again (e.g. after a change to drafting). Day 2 runs
    ``day2_repeats`` times each way, alternating the order; the ratio is of the medians."""
    from pipelines.store.knowledge import read_knowledge
    from benchmarks.report import machine_info, save_report, versions

    if work.exists() and any(work.iterdir()):
        raise FileExistsError(f"{work}: not empty; pass a fresh --work directory")
    json_out.parent.mkdir(parents=True, exist_ok=True)
    data, logs = work / "data", json_out.parent
    load_before = machine_info()["load_average"]
    if day1_from is None:
        base = list(overrides or []) + write_tables(dataset, data)
        runs = {
            "day1_plain": run_once("day1-plain", config, base + PLAIN, work / "plain", logs),
            "day1_laser": run_once("day1-laser", config, base, work / "laser", logs),
        }
        shutil.copytree(data, work / "day1" / "data")  # day 1 as it was: --day1-from reruns day 2 from it
        shutil.copytree(work / "laser", work / "day1" / "laser")
        (work / "day1" / "runs.json").write_text(json.dumps({**runs, "base": base}, default=str))
    else:  # day 1 of an earlier run of this bench, copied
        shutil.copytree(day1_from / "day1", work / "day1")
        shutil.copytree(work / "day1" / "data", data)
        shutil.copytree(work / "day1" / "laser", work / "laser")
        saved = json.loads((work / "day1" / "runs.json").read_text())
        base = [o.replace(str(day1_from / "data"), str(data)) for o in saved.pop("base")]
        runs = {k: saved[k] for k in ("day1_plain", "day1_laser")}
    before = read_knowledge(work / "laser" / "knowledge")
    changed_users, new_item = day_two(data, users, min_history, seed)
    repeats = [day_two_runs(config, base, work, logs, i) for i in range(max(1, day2_repeats))]
    runs["day2_laser"], runs["day2_plain"] = repeats[0]
    rates = {k: [r[j]["tok_s_decode"] for r in repeats] for j, k in enumerate(("day2_laser", "day2_plain"))}
    after = read_knowledge(work / "laser" / "knowledge")
    day2 = after.filter(pl.col("run_id") == runs["day2_laser"]["run_id"])
    got = sorted(zip(day2["entity_type"], day2["entity_id"]))
    want = sorted([("user", u) for u in changed_users] + [("item", new_item)])
    old_text = dict(zip(before["entity_id"], before["knowledge"]))
    changed_texts = sum(
        old_text.get(i) != k
        for t, i, k in day2.select("entity_type", "entity_id", "knowledge").iter_rows()
        if t == "user"
    )
    result = {
        "config": str(config),
        "overrides": list(overrides or []),
        "day1_from": str(day1_from or ""),
        "users": users,
        "min_history": min_history,
        "seed": seed,
        "runs": runs,
        "changed_users": changed_users,
        "new_item": new_item,
        "regenerated_exactly": got == want,
        "regenerated": len(got),
        "user_texts_changed": changed_texts,
        "day2_tok_s_decode": rates,
        "refresh_ratio": _ratio(statistics.median(rates["day2_laser"]), statistics.median(rates["day2_plain"])),
        "first_run_ratio": _ratio(runs["day1_laser"]["entities_per_min"], runs["day1_plain"]["entities_per_min"]),
        "quality": run_quality(work, runs),
        "targets": {"refresh": TARGET_REFRESH, "first_run": TARGET_FIRST},
        "load_average_before": load_before,
        "machine": machine_info(),
        "versions": versions(),
    }
    save_report(result, json_out)
    plot_time(result["runs"], json_out.with_suffix(".png"))
    print_result(result)
    return result


def day_two_runs(config: Path, base: list[str], work: Path, logs: Path, i: int) -> tuple[dict, dict]:
    """Day 2 drafting and not, each on its own copy of day 1's output; the order alternates by repeat ``i``
    so that a drift in the machine's load falls on both."""
    laser, plain = work / ("laser" if i == 0 else f"laser-{i}"), work / f"laser-then-plain-{i}"
    if i:
        shutil.copytree(work / "day1" / "laser", laser)
    shutil.copytree(work / "day1" / "laser", plain)
    order = [("laser", laser), ("plain", plain)] if i % 2 == 0 else [("plain", plain), ("laser", laser)]
    got = {}
    for name, out in order:
        got[name] = run_once(
            f"day2-{name}-{i}",
            config,
            base + (PLAIN if name == "plain" else []),
            out,
            logs,
            ("--keep-existing",) if name == "plain" else (),
        )
    return got["laser"], got["plain"]


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ratio(a: float, b: float) -> float | None:
    return a / b if a and b else None


OUTSIDE = "process start and exit"  # the process's wall outside the job's time account


def plot_time(runs: dict[str, Any], path: Path) -> None:
    """A stacked bar per run of its time account (the process's own start, before the job, on top)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipelines.knowledge.time_account import PHASES

    names = [n for n, r in runs.items() if r.get("time")]
    if not names:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bottoms = [0.0] * len(names)
    colours = [plt.get_cmap("tab20")(i) for i in range(20)]
    for i, phase in enumerate((*PHASES, OUTSIDE)):
        heights = [_phase_s(runs[n], phase) for n in names]
        if any(heights):
            ax.bar(names, heights, bottom=bottoms, label=phase, color=colours[i % len(colours)])
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("seconds (whole process)")
    ax.set_title("where each run's time went")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _phase_s(run: dict[str, Any], phase: str) -> float:
    """A run's seconds in ``phase``; :data:`OUTSIDE`: the process's wall before and after the job."""
    account = run.get("time") or {}
    if phase == OUTSIDE:
        return max(0.0, run["wall_s"] - float(account.get("wall_s", 0.0)))
    return float(account.get("seconds", {}).get(phase, 0.0))


def print_time(result: dict[str, Any], console: Any) -> None:
    """The runs' time accounts side by side: seconds per phase, fixed costs."""
    from rich.table import Table

    from pipelines.knowledge.time_account import PHASES

    runs = {n: r for n, r in result["runs"].items() if r.get("time")}
    if not runs:
        return
    table = Table(title="where the time went (seconds; pipelines/knowledge/time_account.py)")
    table.add_column("phase")
    for name in runs:
        table.add_column(name, justify="right")
    for phase in (*PHASES, OUTSIDE):
        cells = [_phase_s(r, phase) for r in runs.values()]
        if any(cells):
            table.add_row(phase, *(f"{c:.1f}" for c in cells))
    table.add_row("fixed (all but prefill, decode)", *(f"{r['time']['fixed_s']:.1f}" for r in runs.values()))
    table.add_row("process wall", *(f"{r['wall_s']:.1f}" for r in runs.values()))
    console.print(table)


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"scheduled refresh: {len(result['changed_users'])} users + 1 item changed on day 2")
    cols = (
        "run",
        "wall s",
        "entities/min",
        "generated",
        "changed",
        "unchanged",
        "tok/s decode",
        "AAL",
        "accepted/step",
        "own-text share",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "run" else "right")
    for name, r in result["runs"].items():
        share = "-" if r["own_share"] is None else f"{r['own_share']:.0%}"
        table.add_row(
            name,
            f"{r['wall_s']:.1f}",
            f"{r['entities_per_min']:.1f}",
            str(r["generated"]),
            str(r["changed"]),
            str(r["unchanged"]),
            f"{r['tok_s_decode']:.1f}",
            f"{r['aal']:.2f}",
            f"{r['accepted_per_step']:.2f}",
            share,
        )
    console = Console()
    console.print(table)
    print_time(result, console)
    fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    console.print(
        f"day 2 regenerated exactly the changed users and the new item: {result['regenerated_exactly']} "
        f"({result['regenerated']} rows; {result['user_texts_changed']} user texts changed)"
    )
    for name, q in result.get("quality", {}).items():
        console.print(
            f"{name}: {q['rows']} texts, ended {_share(q['ended_share'])}, degenerate "
            f"{_share(q['degenerate_share'])}, grounding {_share(q['grounding'])}"
        )
    rates = result.get("day2_tok_s_decode", {})
    console.print(
        "day 2 decode tok/s per repeat: "
        + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in rates.items())
    )
    console.print(
        f"day 2 decode tok/s, drafting / none (medians): {fmt(result['refresh_ratio'])} (target >= "
        f"{TARGET_REFRESH}x); day 1 entities/min, drafting / none: {fmt(result['first_run_ratio'])} "
        f"(target >= {TARGET_FIRST}x); load average {result['machine']['load_average']}"
    )
