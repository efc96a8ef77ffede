"""`laser bench driver`: the job's one hand-written driver against Ray Data's batch API on the same work.

Both run the same worker (:class:`~pipelines.knowledge.generation.GenerationWorker`: the model loaded once
per actor, the continuous engine) over the same requests (the job config's old-knowledge requests: every
user with an old history and every item; no pools, so both see identical work), with the same number of
actors, threads and slots, interleaved run by run:

- ``driver``: :class:`pipelines.workers.WorkerGroup` — each actor keeps ``slots`` requests decoding and
  half as many queued, so a finished request's slot is refilled at once;
- ``ray data``: ``ray.data.from_items(...).map_batches(worker, batch_size=slots, concurrency=actors)`` —
  each call decodes one batch of ``slots`` requests to its end (the engine keeps them continuously
  batched inside the call), results consumed with ``iter_rows``.

Wall time covers the whole pass: actor start, model load, decoding, and writing every row into a
knowledge store. Rows lost or written twice are counted from the store. Prints a table and writes JSON,
Markdown and a PNG.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.config import JobConfig
from pipelines.knowledge.generation import GenerationReport, GenerationWorker, record_result
from pipelines.knowledge.records import DecodeTask
from pipelines.store.knowledge import KnowledgeWriter, read_knowledge
from benchmarks.report import machine_info, versions, wide_console, save_report
from pipelines.workers import GenerationRequest, ModelSpec, WorkerGroup, ensure_ray, make_batches

log = logging.getLogger(__name__)

METHODS = ("driver", "ray data")


@dataclass(frozen=True)
class DriverBenchSettings:
    model: str | None = None  # default: the config's model
    workers: int = 2
    threads: int = 1
    slots: int = 4
    max_new_tokens: int = 48
    repeats: int = 2


class DataWorker:
    """Ray Data's callable class: one GenerationWorker per actor, one batch of requests per call."""

    def __init__(self, spec: ModelSpec, task: DecodeTask, slots: int) -> None:
        self.worker, self.task, self.slots = GenerationWorker(spec), task, slots

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.worker.generate(self.task, list(batch["request"]), self.slots)
        return {"result": np.array([result], dtype=object)}


def _driver_pass(
    spec: ModelSpec,
    task: DecodeTask,
    requests: list[GenerationRequest],
    s: DriverBenchSettings,
    writer: KnowledgeWriter,
    report: GenerationReport,
) -> None:
    with WorkerGroup(GenerationWorker, spec, s.workers) as group:
        for result in group.stream(requests, task, slots=s.slots, desc="driver"):
            record_result(result, writer, report)


def _ray_data_pass(
    spec: ModelSpec,
    task: DecodeTask,
    requests: list[GenerationRequest],
    s: DriverBenchSettings,
    writer: KnowledgeWriter,
    report: GenerationReport,
) -> None:
    import ray.data

    ordered = [r for batches in make_batches(requests, s.slots).values() for b in batches for r in b]  # pool order
    items = ray.data.from_items([{"request": r} for r in ordered])
    ds = items.map_batches(
        DataWorker,
        fn_constructor_kwargs={"spec": spec, "task": task, "slots": s.slots},
        batch_size=s.slots,
        concurrency=s.workers,
        num_cpus=spec.threads,
        max_restarts=3,
        max_task_retries=3,
    )
    for row in ds.iter_rows():
        record_result(row["result"], writer, report)


def _measure(
    method: str,
    spec: ModelSpec,
    task: DecodeTask,
    requests: list[GenerationRequest],
    s: DriverBenchSettings,
    store: Path,
) -> dict[str, Any]:
    report, start = GenerationReport(), time.perf_counter()
    with KnowledgeWriter(store, shard_rows=8, run_id=task.run_id) as writer:
        (_driver_pass if method == "driver" else _ray_data_pass)(spec, task, requests, s, writer, report)
        writer.flush()
    wall = time.perf_counter() - start
    rows = read_knowledge(store, dedup=False)
    written = rows.height
    unique = rows.select("entity_type", "entity_id").unique().height
    return {
        "wall_s": wall,
        "rows": written,
        "lost": len(requests) - unique - report.failed,
        "duplicated": written - unique,
        "failed": report.failed,
        "n_tokens": report.n_tokens,
        "entities_per_s": unique / wall,
        "tokens_per_s": report.n_tokens / wall,
    }


def run_driver_bench(json_out: Path, cfg: JobConfig, s: DriverBenchSettings) -> dict[str, Any]:
    """Both methods over ``cfg``'s old-knowledge requests (the config is loaded by the caller)."""
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.requests import old_requests

    data = load_job_data(cfg, mode="paper")
    requests = old_requests(data.dataset, data.split)
    spec = ModelSpec(s.model or cfg.model.name, cfg.model.dtype, threads=s.threads, seed=cfg.dataset.seed)
    task = DecodeTask(
        "autoregressive", max_new_tokens=s.max_new_tokens, domain=data.dataset.domain, run_id="bench", degenerate="keep"
    )
    ensure_ray(None, num_cpus=s.workers * s.threads)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(s.repeats):
            for method in METHODS if rep % 2 == 0 else METHODS[::-1]:  # interleaved, order alternating
                runs[method].append(_measure(method, spec, task, requests, s, Path(tmp) / f"{method}-{rep}"))
                log.info("%s run %d: %.1f s", method, rep, runs[method][-1]["wall_s"])
    summary = {
        m: {
            "wall_s_median": float(np.median([r["wall_s"] for r in rs])),
            "entities_per_s_median": float(np.median([r["entities_per_s"] for r in rs])),
            "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in rs])),
            "lost": sum(r["lost"] for r in rs),
            "duplicated": sum(r["duplicated"] for r in rs),
        }
        for m, rs in runs.items()
    }
    summary["ray data"]["speed_vs_driver"] = (
        summary["ray data"]["entities_per_s_median"] / summary["driver"]["entities_per_s_median"]
    )
    report = {
        "settings": asdict(s),
        "requests": len(requests),
        "runs": runs,
        "summary": summary,
        "machine": machine_info(),
        "versions": {**versions(), "ray": _ray_version()},
    }
    save_report(report, json_out, markdown_driver(report))
    plot_driver(report, json_out.with_suffix(".png"))
    print_driver(report)
    return report


def _ray_version() -> str:
    import ray

    return ray.__version__


def _table_rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for m, v in report["summary"].items():
        out.append(
            [
                m,
                f"{v['wall_s_median']:.1f}",
                f"{v['entities_per_s_median']:.3f}",
                f"{v['tokens_per_s_median']:.1f}",
                f"{v.get('speed_vs_driver', 1.0):.2f}x",
                str(v["lost"]),
                str(v["duplicated"]),
            ]
        )
    return out


HEADERS = ["method", "wall s (median)", "entities/s", "tokens/s", "vs driver", "lost", "written twice"]


def print_driver(report: dict[str, Any]) -> None:
    from rich.table import Table

    s = report["settings"]
    t = Table(
        title=f"laser bench driver: {report['requests']} requests, {s['workers']} actors x {s['threads']} "
        f"thread(s), {s['slots']} slots, {s['max_new_tokens']} new tokens, {s['repeats']} runs each"
    )
    for h in HEADERS:
        t.add_column(h, justify="right")
    for row in _table_rows(report):
        t.add_row(*row)
    console = wide_console()
    console.print(t)
    console.print(f"load average {report['machine']['load_average']}")


def markdown_driver(report: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in _table_rows(report)]
    s = report["settings"]
    return (
        f"{report['requests']} requests, {s['workers']} actors x {s['threads']} thread(s), {s['slots']} slots, "
        f"{s['max_new_tokens']} new tokens, median of {s['repeats']} interleaved runs; wall time includes actor "
        f"start, model load, decoding and writing. Load average {report['machine']['load_average']}.\n\n"
        + "\n".join(lines)
        + "\n"
    )


def plot_driver(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = list(report["summary"])
    for i, m in enumerate(names):
        walls = [r["wall_s"] for r in report["runs"][m]]
        ax.bar(i, float(np.median(walls)), color=f"C{i}")
        ax.scatter([i] * len(walls), walls, color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("wall seconds per pass (lower is better)")
    ax.set_title(f"{report['requests']} entities, same worker and actors")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
