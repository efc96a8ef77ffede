"""`laser bench engines`: the job's entities per minute on each engine, and on Ray Data LLM beside it.

Rows (``--engines``, comma-separated):

- ``hf``, ``vllm``: the job itself (``python -m jobs run CONFIG --set execution.engine=E``);
- ``ray-data-llm``: the same entities, prompts, model, token budget and resources through ``ray.data.llm``
  on plain vLLM (:mod:`benchmarks.ray_data_llm`); ``ray-data-llm-ngram`` and
  ``ray-data-llm-suffix`` add vLLM's prompt-lookup or Arctic Inference's suffix speculation (8 tokens).

Every run is a fresh process on an empty output, timed from process start to its end. Figures per run,
from the process's wall clock and its ``summary.json``:

- **whole**: entities (old and new knowledge) per minute of the whole process: imports, Ray start, engine
  start and model load, (job rows:) routing and pools, generation, writing;
- **old pass** and **new pass**: entities per minute of each generation pass. The job's actors serve both
  of its passes (the old pass pays their start); Ray Data starts its engines again for each pass, so its
  new pass pays an engine start too. **New pass, engines running** takes that start out: the job's new
  pass as it is; Ray Data's entities over the seconds from its engine's readiness (Ray Data's own timing of
  its vLLM stage: the first batch's start) to the pass's end.

**Cold and warm**: each row's compile caches (vLLM's ``VLLM_CACHE_ROOT``, torch inductor's
``TORCHINDUCTOR_CACHE_DIR``) and LASER's measured cost models live under ``WORK/caches/<row>/``. With
``cold`` (the default), every row first runs once on empty caches (the **cold** run: the first run on a
machine), then ``repeats`` times, interleaved, on the caches its cold run filled (**warm**). Without
``cold``, every run uses the machine's own caches and counts as warm.

Prints a table and writes JSON, Markdown (the cold run and the median warm run of each row) and a PNG
(``<stem>.png``), and stamps each run's output with the seconds since its start
(``<json stem>-<row>-<phase><i>.log`` beside the JSON).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from pipelines.knowledge.engines import ENGINES as JOB_ENGINES

RAY_DATA_ROWS = {"ray-data-llm": "none", "ray-data-llm-ngram": "ngram", "ray-data-llm-suffix": "suffix"}
ENGINES = (*JOB_ENGINES, "ray-data-llm")  # the default rows
KNOWN = (*JOB_ENGINES, *RAY_DATA_ROWS)  # JOB_ENGINES: the engine registry (a dict), by name


def check_engines(engines: Sequence[str]) -> None:
    """Unknown rows, and rows whose packages are missing, fail before any run starts."""
    unknown = [e for e in engines if e not in KNOWN]
    if unknown:
        raise ValueError(f"unknown engine row(s) {unknown}; choose from {list(KNOWN)}")
    needs = {"vllm": ["vllm"], "ray-data-llm-suffix": ["vllm", "arctic_inference"]}
    for e in engines:
        wanted = needs.get(e, ["vllm"] if e in RAY_DATA_ROWS else [])
        missing = [m for m in wanted if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"engine row {e!r} needs {missing}, not installed here")


def command(config: Path, engine: str, out: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The fresh process of one run."""
    sets = [a for o in overrides for a in ("--set", o)]
    if engine in JOB_ENGINES:
        return [
            sys.executable,
            "-m",
            "jobs",
            "run",
            str(config),
            *sets,
            "--set",
            f"execution.engine={engine}",
            "--set",
            f"output.path={out}",
        ]
    return [
        sys.executable,
        "-m",
        "benchmarks.rows",
        "ray-data-llm",
        str(config),
        "--out",
        str(out),
        "--speculation",
        RAY_DATA_ROWS[engine],
        *sets,
    ]


def timed_job(
    config: Path,
    engine: str,
    out: Path,
    log_path: Path,
    overrides: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One full run of row ``engine`` in a fresh process: wall seconds and the summary's passes."""
    cmd = command(config, engine, out, overrides)
    start = time.perf_counter()
    with (
        open(log_path, "w") as fh,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
        ) as proc,
    ):
        if proc.stdout is None:
            raise RuntimeError(f"{engine}: the job's output pipe did not open")
        for line in proc.stdout:
            fh.write(f"{time.perf_counter() - start:7.1f}s {line}")
            fh.flush()  # the log follows a run of an hour as it goes
        code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"the {engine} run exited {code}; see {log_path}")
    summary = json.loads((out / "summary.json").read_text())
    if engine in JOB_ENGINES:
        passes = {name: _pass(summary[name]) for name in ("old", "new")}
        passes["new"]["running_entities_per_min"] = passes["new"]["entities_per_min"]  # the actors are up already
    else:
        passes = {name: summary[name] for name in ("old", "new")}
    entities = passes["old"]["entities"] + passes["new"]["entities"]
    return {"engine": engine, "wall_s": wall, "entities": entities, "entities_per_min": 60 * entities / wall, **passes}


def _pass(rep: dict[str, Any]) -> dict[str, Any]:
    done, wall = int(rep["done"]), float(rep["wall_s"])
    return {
        "entities": done,
        "failed": int(rep["failed"]),
        "wall_s": wall,
        "tokens": int(rep["n_tokens"]),
        "entities_per_min": 60 * done / wall if wall else 0.0,
        "tokens_per_s": float(rep["tokens_per_s_wall"]),
        "aal": float(rep["aal"]),
        "decoded_tokens": int(rep.get("decoded_tokens", rep["n_tokens"])),
        "retries": int(rep.get("retries", rep.get("greedy_retries", 0))),
        "decode_tokens_per_s": float(rep.get("tokens_per_s_decode") or 0.0) or None,
    }


def cache_env(work: Path, engine: str) -> dict[str, str]:
    """Compile and cost-model caches of one row under ``work/caches/<row>`` (the model folders are shared:
    the row's LASER cache links the machine's ``models``)."""
    from laser.models import cache_dir

    root = (work / "caches" / engine).resolve()
    laser_cache = root / "laser"
    for d in (root / "vllm", root / "inductor", laser_cache):
        d.mkdir(parents=True, exist_ok=True)
    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    link = laser_cache / "models"
    if not link.exists():
        link.symlink_to(models.resolve(), target_is_directory=True)
    return {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "LASER_CACHE_DIR": str(laser_cache),
    }


def run_engines_bench(
    json_out: Path,
    config: Path,
    work: Path,
    engines: tuple[str, ...] = ENGINES,
    repeats: int = 1,
    overrides: Sequence[str] = (),
    cold: bool = True,
) -> dict[str, Any]:
    """Each row cold once (``cold``), then ``repeats`` warm runs, interleaved; prints the table, writes
    ``json_out``, Markdown and a PNG."""
    from benchmarks.report import machine_info

    check_engines(engines)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    load_before = machine_info()["load_average"]
    plan = [("cold", 0, e) for e in engines] if cold else []
    plan += [("warm", i, e) for i in range(repeats) for e in engines]
    for phase, i, engine in plan:
        if (work / f"{engine}-{phase}{i}").exists():
            raise FileExistsError(f"{work / f'{engine}-{phase}{i}'}: not empty; pass a fresh --work directory")
    runs: list[dict[str, Any]] = []
    for phase, i, engine in plan:
        env = cache_env(work, engine) if cold else None
        run = timed_job(
            config,
            engine,
            work / f"{engine}-{phase}{i}",
            json_out.parent / f"{json_out.stem}-{engine}-{phase}{i}.log",
            overrides,
            env,
        )
        runs.append({**run, "phase": phase})
        _save(json_out, config, overrides, repeats, cold, runs, engines, load_before)
    result = _save(json_out, config, overrides, repeats, cold, runs, engines, load_before)
    json_out.with_suffix(".md").write_text(markdown(result))
    plot(result, json_out.with_suffix(".png"))
    print_result(result)
    return result


def _save(
    json_out: Path,
    config: Path,
    overrides: Sequence[str],
    repeats: int,
    cold: bool,
    runs: list[dict[str, Any]],
    engines: tuple[str, ...],
    load_before: Any,
) -> dict[str, Any]:
    """The result so far, written after every run (a long bench killed midway keeps what it measured)."""
    from benchmarks.report import machine_info, save_report, versions

    warm = {e: _median_run([r for r in runs if r["engine"] == e and r["phase"] == "warm"]) for e in engines}
    cold_runs = {e: next((r for r in runs if r["engine"] == e and r["phase"] == "cold"), None) for e in engines}
    result = {
        "config": str(config),
        "overrides": list(overrides),
        "repeats": repeats,
        "cold": cold,
        "runs": runs,
        "median": {e: r for e, r in warm.items() if r},
        "cold_runs": {e: r for e, r in cold_runs.items() if r},
        "load_average_before": load_before,
        "machine": machine_info(),
        "versions": versions(),
    }
    save_report(result, json_out)
    return result


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run whose whole wall time is the median of the row's runs."""
    if not runs:
        return None
    mid = statistics.median_low(sorted(r["wall_s"] for r in runs))
    return next(r for r in runs if r["wall_s"] == mid)


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pass_rate(rep: dict[str, Any]) -> str:
    """A pass's entities per minute; "-" for a pass that had nothing to do."""
    return _rate(rep["entities_per_min"] if rep["entities"] or rep["failed"] else None)


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for phase, runs in (("cold", result.get("cold_runs", {})), ("warm", result["median"])):
        for engine, r in runs.items():
            new = r["new"]
            aal = new.get("aal")
            rows.append(
                [
                    engine,
                    phase,
                    f"{r['entities']}",
                    f"{r['wall_s']:.1f}",
                    f"{r['entities_per_min']:.1f}",
                    _pass_rate(r["old"]),
                    _pass_rate(new),
                    _rate(new.get("running_entities_per_min")),
                    _rate(new["tokens_per_s"]),
                    "-" if aal is None else f"{aal:.2f}",
                    _decode_cell(r["old"], new),
                ]
            )
    return rows


COLUMNS = [
    "engine",
    "run",
    "entities",
    "whole wall s",
    "whole entities/min",
    "old pass entities/min",
    "new pass entities/min",
    "new pass, engines running",
    "new pass tok/s",
    "new pass AAL",
    "decode tok/s old / new pass",
]


def _decode_cell(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The job's decode rates (its summary's tok/s decode: steps with no prefill in them) of the plain old
    pass and the new pass on the same actors, and their ratio; "-" where not measured."""
    a, b = old.get("decode_tokens_per_s"), new.get("decode_tokens_per_s")
    if not a or not b:
        return "-"
    return f"{a:.1f} / {b:.1f} ({b / a:.2f}x)"


def markdown(result: dict[str, Any]) -> str:
    sets = " ".join(f"--set {o}" for o in result.get("overrides", []))
    lines = [
        f"# Entities per minute by engine ({result['config']}{' ' + sets if sets else ''})",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(result)]
    m = result["machine"]
    phases = (
        f"cold: each row's first run, on empty compile and cost-model caches; warm: median of {result['repeats']} "
        "interleaved run(s) per row on the caches the cold run filled."
        if result.get("cold", True)
        else f"warm: median of {result['repeats']} interleaved run(s) per row on the machine's own caches (--no-cold)."
    )
    lines += [
        "",
        f"{phases} Each run is a fresh process on an empty output. Whole-run figures include imports, "
        "Ray start, engine start and model load, (job rows) routing and pools, and writing. The job's actors serve both passes (its old pass "
        "pays their start); Ray Data LLM starts its engines for each pass, so its new pass pays a start too. "
        "'engines running': the job's new pass; Ray Data LLM's entities over the seconds from its first engine's "
        "readiness (Ray Data's timing of its vLLM stage: the first batch's start) to the pass's end.",
        f"Machine: {m.get('cpu_count')} CPUs; load average before {result['load_average_before']}, "
        f"after {m.get('load_average')}.",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Bars per row: whole-run and new-pass (engines running) entities per minute, cold and warm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (title, get) in zip(
        axes,
        (
            ("whole run", lambda r: r["entities_per_min"]),
            ("new pass, engines running", lambda r: r["new"].get("running_entities_per_min") or 0.0),
        ),
    ):
        labels, values, colors = [], [], []
        for phase, runs, color in (
            ("cold", result.get("cold_runs", {}), "tab:gray"),
            ("warm", result["median"], "tab:blue"),
        ):
            for engine, r in runs.items():
                labels.append(f"{engine}\n{phase}")
                values.append(get(r))
                colors.append(color)
        bars = ax.bar(range(len(values)), values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=8)
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        ax.set_ylabel("entities / min")
        ax.set_title(title)
    fig.suptitle(f"entities per minute by engine ({Path(result['config']).name})")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def print_result(result: dict[str, Any]) -> None:
    from rich.table import Table

    from benchmarks.report import wide_console

    table = Table(title=f"entities per minute by engine ({result['config']})")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("engine", "run") else "right")
    for row in _rows(result):
        table.add_row(*row)
    wide_console().print(table)
