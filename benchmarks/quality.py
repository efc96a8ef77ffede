"""`laser bench quality`: the quality of new knowledge per decoder, on the same entities.

Fixture: a job config (the demo job by default) run in-process without Ray: old knowledge, routing and
pools as the job makes them, then the new-knowledge requests of the first ``entities`` entities (users
and items, sorted by type and id), decoded by each method with the job's generation settings
(prompts, rules, degenerate policy):

- ``autoregressive greedy``: the target's greedy text (no pool);
- ``laser greedy``: routed pools, greedy verification (lossless: the same text as the previous one);
- ``laser relaxed``: routed pools, relaxed verification with the config's k and p (default k=2, p=0.1).

With ``engines`` ("hf", "vllm" or both) every method runs on each engine (labels ``engine: method``
when there are several), on the same entities, prompts and pools (old knowledge and pools come from the
first engine).

Per method (pipelines/quality/): ended (EOS or sentence end), cut at the token limit,
degenerate, fragment, retried, mean words / asked words, grounding (matched / mentioned facts) with 95%
Wilson intervals, and tokens/s. Differences come with a paired bootstrap 95% interval over the entities:
relaxed minus greedy LASER on each engine, and, with two engines, the second minus the first for each
method, called equal when every interval holds 0. Output: a table, JSON, Markdown and a PNG beside the JSON.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laser.decoders import available_decoders
from laser.defaults import RELAXED_K, RELAXED_P
from pipelines.config import JobConfig
from pipelines.knowledge.generation import BatchResult, GenerationWorker
from pipelines.knowledge.decoders import new_knowledge_decoder
from pipelines.knowledge.engines import ENGINES
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.job import knowledge_task, step_old_knowledge
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.requests import new_requests, pool_routes
from pipelines.knowledge.pool_build import step_build_pools
from pipelines.knowledge.routing import step_route
from pipelines.quality import MAX_REPEAT_4GRAM, MIN_WORDS, QualitySummary, catalogue_brands, row_quality
from benchmarks.report import machine_info, versions, wide_console, save_report
from pipelines.workers import GenerationRequest, LocalGroup, ModelSpec
from pipelines.workers.layout import compile_model

log = logging.getLogger(__name__)

SHARES = ("ended", "cut", "degenerate", "fragment")  # per-row flags reported as shares
GREEDY_REF = "laser greedy"
RELAXED = "laser relaxed"


@dataclass
class QualityBenchSettings:
    entities: int = 24  # new-knowledge entities measured (users first, then items)
    threads: int = 1
    bootstrap: int = 2000
    seed: int = 0
    engines: tuple[str, ...] = ("hf",)  # every method runs on each, in this order

    def __post_init__(self) -> None:
        if not self.engines or set(self.engines) - set(ENGINES):
            raise ValueError(f"engines {self.engines!r}: choose among {', '.join(ENGINES)}")


def label(engine: str, method: str, engines: tuple[str, ...]) -> str:
    """A row label: the method alone with one engine, ``engine: method`` with several."""
    return method if len(engines) == 1 else f"{engine}: {method}"


def methods(cfg: JobConfig) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, decoder, params) of the compared methods; relaxed keeps the config's k and p."""
    relaxed = {"k": RELAXED_K, "p": RELAXED_P, **{k: v for k, v in cfg.decoder.params.items() if k in ("k", "p")}}
    return [
        ("autoregressive greedy", "autoregressive", {}),
        (GREEDY_REF, "laser", {"verification": "greedy"}),
        (RELAXED, "laser", {"verification": "relaxed", **relaxed}),
    ]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a share k/n ((0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (mid - half) / (1 + z * z / n)), min(1.0, (mid + half) / (1 + z * z / n))


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    weights_a: np.ndarray | None = None,
    weights_b: np.ndarray | None = None,
    n: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Mean (or weighted ratio) of ``a`` minus that of ``b`` over the same entities, with a paired
    percentile-bootstrap 95% interval (entities resampled together)."""
    wa = np.ones_like(a, dtype=float) if weights_a is None else weights_a
    wb = np.ones_like(b, dtype=float) if weights_b is None else weights_b

    def stat(idx: np.ndarray) -> float:
        sa, sb = wa[idx].sum(), wb[idx].sum()
        return (a[idx].sum() / sa if sa else 0.0) - (b[idx].sum() / sb if sb else 0.0)

    rng = np.random.default_rng(seed)
    full = stat(np.arange(len(a)))
    draws = [stat(rng.integers(0, len(a), len(a))) for _ in range(n)] if len(a) else [0.0]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {"diff": round(float(full), 4), "lo": round(float(lo), 4), "hi": round(float(hi), 4)}


def _select(requests: list[GenerationRequest], ids: list[tuple[str, str]]) -> list[GenerationRequest]:
    by_key = {(r.entity_type, r.entity_id): r for r in requests}
    return [by_key[k] for k in ids]


def run_quality_bench(
    json_out: Path, cfg: JobConfig, settings: QualityBenchSettings, config_name: str = ""
) -> dict[str, Any]:
    """Run the methods on the same entities of ``cfg``'s job (output.path holds old knowledge and pools)."""
    data = load_job_data(cfg)
    paths = JobPaths.of(cfg)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.work.mkdir(parents=True, exist_ok=True)
    workers = {e: _worker(cfg, e, settings) for e in settings.engines}
    step_old_knowledge(cfg, data, LocalGroup(workers[settings.engines[0]]))
    routing = step_route(cfg, data)
    step_build_pools(cfg, pool_need="both")
    base = new_requests(data.dataset, data.split, {})
    ids = [(r.entity_type, r.entity_id) for r in sorted(base, key=lambda r: (r.entity_type != "user", r.entity_id))]
    users = [k for k in ids if k[0] == "user"][: (settings.entities + 1) // 2]
    items = [k for k in ids if k[0] == "item"][: settings.entities - len(users)]
    chosen = users + items + [k for k in ids if k not in users + items][: settings.entities - len(users) - len(items)]
    brands = catalogue_brands(data.dataset.items)
    base_task = knowledge_task(
        cfg, new_knowledge_decoder(cfg), "bench-quality", data.dataset.domain, paths.pools, brands=brands
    )
    order = {k: i for i, k in enumerate(chosen)}
    rows: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for engine, worker in workers.items():
        for method, decoder, params in methods(cfg):
            name = label(engine, method, settings.engines)
            task = dataclasses.replace(base_task, decoder=decoder, decoder_params=params, sampling=None)
            reqs = _select(
                new_requests(data.dataset, data.split, pool_routes(available_decoders()[decoder].pool, routing)), chosen
            )
            t0 = time.perf_counter()
            result = worker.generate(task, reqs, cfg.execution.batch_size)
            if not isinstance(result, BatchResult):  # what a GenerationWorker yields
                raise TypeError(f"{name}: the worker returned a {type(result).__name__}, not knowledge rows")
            seconds[name] = time.perf_counter() - t0
            rows[name] = [r.as_dict() for r in sorted(result.rows, key=lambda r: order[(r.entity_type, r.entity_id)])]
            log.info("%s: %d rows, %d failures in %.1fs", name, len(result.rows), len(result.failures), seconds[name])
    report = _report(rows, seconds, settings, cfg, chosen, config_name)
    report["versions"]["prompt_version"] = base_task.prompt_version  # the config's template, not the shipped default
    _write(json_out, report)
    print_table(report)
    return report


def _worker(cfg: JobConfig, engine: str, settings: QualityBenchSettings) -> GenerationWorker:
    """An in-process worker of ``engine`` (vLLM compiles as the job would for this many entities)."""
    spec = ModelSpec(
        cfg.model.name,
        cfg.model.dtype,
        settings.threads,
        cfg.dataset.seed,
        compile=compile_model(cfg.execution, settings.entities),
        engine=engine,
    )
    return GenerationWorker(spec)


def _summary(rows: list[dict[str, Any]]) -> QualitySummary:
    s = QualitySummary()
    for r in rows:
        s.add(row_quality(r))
    return s


def _flags(rows: list[dict[str, Any]], name: str) -> np.ndarray:
    return np.array([bool(r[name]) for r in rows], dtype=float)


def flag_contradicts(row: dict[str, Any]) -> bool:
    """The row's stored degenerate flag disagrees with its stored repeat share and word count."""
    expected = (row["n_words"] is not None and row["n_words"] < MIN_WORDS) or row["repeat_4gram"] >= MAX_REPEAT_4GRAM
    return bool(row["degenerate"]) != bool(expected)


def _report(
    rows: dict[str, list[dict[str, Any]]],
    seconds: dict[str, float],
    settings: QualityBenchSettings,
    cfg: JobConfig,
    chosen: list[tuple[str, str]],
    config_name: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "methods": {},
        "settings": dataclasses.asdict(settings),
        "config": config_name,
        "entities": len(chosen),
        "users": sum(k[0] == "user" for k in chosen),
        "max_new_tokens": cfg.generation.max_new_tokens,
        "generation": cfg.generation.model_dump(),
        "machine": machine_info(),
        "versions": versions(),
    }
    for name, rs in rows.items():
        s: dict[str, Any] = _summary(rs).as_dict()
        n = len(rs)
        s["intervals"] = {f: wilson(int(_flags(rs, f).sum()), n) for f in SHARES}
        s["intervals"]["grounding"] = wilson(s["facts_matched"], s["facts_mentioned"])
        s["retried"] = sum(bool(r["greedy_retry"]) for r in rs)
        s["flag_contradictions"] = sum(flag_contradicts(r) for r in rs)
        s["tokens"] = sum(r["n_tokens"] for r in rs)
        s["seconds"] = round(seconds[name], 2)
        s["tokens_per_s"] = round(s["tokens"] / seconds[name], 2) if seconds[name] else None
        out["methods"][name] = s
    out["differences"] = {}
    for engine in settings.engines:
        ref, greedy, relaxed = (
            label(engine, m, settings.engines) for m in ("autoregressive greedy", GREEDY_REF, RELAXED)
        )
        if ref in rows and greedy in rows:
            same = [a["knowledge"] == b["knowledge"] for a, b in zip(rows[ref], rows[greedy])]
            out.setdefault("laser_greedy_identical_to_autoregressive", {})[engine] = f"{sum(same)}/{len(same)}"
        if greedy in rows and relaxed in rows:
            d = _differences(rows[relaxed], rows[greedy], settings)
            d["same_texts"] = _same_texts(rows[relaxed], rows[greedy])
            out["differences"][f"{relaxed} - {greedy}"] = d
    first, *others = settings.engines
    for engine in others:  # each further engine against the first, method by method
        for method, _, _ in methods(cfg):
            a, b = label(engine, method, settings.engines), label(first, method, settings.engines)
            if a in rows and b in rows:
                d = _differences(rows[a], rows[b], settings)
                d["equal"] = all(m["lo"] <= 0.0 <= m["hi"] for m in d.values())
                d["same_texts"] = _same_texts(rows[a], rows[b])
                out["differences"][f"{a} - {b}"] = d
    out["samples"] = {
        name: [{"entity": f"{r['entity_type']}:{r['entity_id']}", "text": r["knowledge"]} for r in rs[:4]]
        for name, rs in rows.items()
    }
    return out


def _same_texts(a_rows: list[dict[str, Any]], b_rows: list[dict[str, Any]]) -> str:
    """How many of the same entities got the same text from both methods, ``"k/n"``."""
    return f"{sum(a['knowledge'] == b['knowledge'] for a, b in zip(a_rows, b_rows))}/{len(a_rows)}"


def _differences(
    a_rows: list[dict[str, Any]], b_rows: list[dict[str, Any]], settings: QualityBenchSettings
) -> dict[str, Any]:
    """Paired bootstrap of a - b (same entities, same order) for each share and for grounding (matched /
    mentioned facts)."""
    diffs: dict[str, Any] = {
        f: paired_bootstrap(_flags(a_rows, f), _flags(b_rows, f), n=settings.bootstrap, seed=settings.seed)
        for f in SHARES
    }

    def facts(rs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        mentioned = np.array([r["facts_mentioned"] or 0 for r in rs], dtype=float)
        return np.array([(r["grounding"] or 0.0) for r in rs]) * mentioned, mentioned

    (ma, na), (mb, nb) = facts(a_rows), facts(b_rows)
    diffs["grounding"] = paired_bootstrap(ma, mb, na, nb, n=settings.bootstrap, seed=settings.seed)
    return diffs


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per method: n, ended, cut, degenerate, fragment, retried, words/asked, grounding, tokens/s."""
    out = []
    for label, m in report["methods"].items():
        iv = m["intervals"]

        def cell(f: str) -> str:
            share = m[f + "_share"] if f + "_share" in m else m[f] / max(1, m["n"])
            return f"{_pct(share)} [{_pct(iv[f][0])}, {_pct(iv[f][1])}]"

        out.append(
            [
                label,
                str(m["n"]),
                cell("ended"),
                cell("cut"),
                cell("degenerate"),
                cell("fragment"),
                str(m["retried"]),
                f"{m['mean_length_ratio']:.2f}" if m["mean_length_ratio"] is not None else "-",
                f"{_pct(m['grounding'])} [{_pct(iv['grounding'][0])}, {_pct(iv['grounding'][1])}] "
                f"of {m['facts_mentioned']}",
                f"{m['tokens_per_s']}",
            ]
        )
    return out


HEADER = ["method", "rows", "ended", "cut", "degenerate", "fragment", "retried", "words/asked", "grounding", "tok/s"]


def print_table(report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"knowledge quality, {report['entities']} entities (95% Wilson intervals)")
    for col in HEADER:
        table.add_column(col)
    for row in table_rows(report):
        table.add_row(*row)
    console = wide_console()
    console.print(table)
    for name, diffs in report.get("differences", {}).items():
        verdict = (
            f" (same texts {diffs['same_texts']})"
            if "equal" not in diffs
            else f" ({'equal' if diffs['equal'] else 'NOT equal'} within 95% intervals; same texts {diffs['same_texts']})"
        )
        console.print(
            f"{name}{verdict}: "
            + ", ".join(f"{f} {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" for f, d in _measures(diffs))
        )


def _measures(diffs: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """The (measure, difference) pairs of one comparison (its verdict keys left out)."""
    return [(f, d) for f, d in diffs.items() if isinstance(d, dict)]


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Knowledge quality ({report['config'] or 'job config'})",
        "",
        f"{report['entities']} new-knowledge entities ({report['users']} users), max_new_tokens "
        f"{report['max_new_tokens']}; load average {m['load_average']} on {m['cpu_count']} CPUs. "
        f"Shares with 95% Wilson intervals.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(report)]
    lines += [
        "",
        "Rows whose degenerate flag contradicts their stored repeat share: "
        + ", ".join(f"{k} {m['flag_contradictions']}" for k, m in report["methods"].items())
        + ".",
    ]
    for engine, same in report.get("laser_greedy_identical_to_autoregressive", {}).items():
        lines += ["", f"laser greedy identical to autoregressive greedy on {engine}: {same} rows."]
    for name, diffs in report.get("differences", {}).items():
        verdict = (
            f" Identical texts {diffs['same_texts']}."
            if "equal" not in diffs
            else (
                f" {'Equal' if diffs['equal'] else 'Not equal'} within the 95% "
                f"intervals; identical texts {diffs['same_texts']}."
            )
        )
        lines += [
            "",
            f"{name} (paired bootstrap over entities, 95% interval).{verdict}",
            "",
            "| measure | difference | interval |",
            "|---|---|---|",
        ]
        lines += [f"| {f} | {d['diff']:+.3f} | [{d['lo']:+.3f}, {d['hi']:+.3f}] |" for f, d in _measures(diffs)]
    lines += ["", "Samples (first rows per method):", ""]
    for label, samples in report["samples"].items():
        for s in samples:
            lines.append(f"- {label}, {s['entity']}: {json.dumps(s['text'])}")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = ["ended", "cut", "degenerate", "fragment", "grounding"]
    labels = list(report["methods"])
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        m = report["methods"][label]
        vals = [m["grounding"] or 0.0 if f == "grounding" else m[f] / max(1, m["n"]) for f in measures]
        lo = [v - m["intervals"][f][0] for v, f in zip(vals, measures)]
        hi = [m["intervals"][f][1] - v for v, f in zip(vals, measures)]
        ax.bar(np.arange(len(measures)) + i * width, vals, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(np.arange(len(measures)) + width * (len(labels) - 1) / 2, measures)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of rows (grounding: of facts)")
    ax.set_title(f"Knowledge quality, {report['entities']} entities (95% Wilson intervals)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(json_out: Path, report: dict[str, Any]) -> None:
    save_report(report, json_out)
    json_out.with_suffix(".md").write_text(markdown(report))
    plot(report, json_out.with_suffix(".png"))
