"""`laser bench throughput`: tokens per second of the whole machine at the concurrency a job runs.

Same prompts for every method (the user task of `laser bench suite`: new histories, pools of earlier
profiles), one process, methods interleaved at each concurrency. At concurrency c a method decodes the
first ``max(c, min_prompts)`` prompts with at most c in flight:

- transformers ``generate``: static left-padded batches of c (the batch waits for its longest row);
- ours: the continuous engine with c slots (a finished request's slot is refilled at once).

Reported per method and concurrency: tokens/s with prefill (wall) and decode-only (wall minus prefill
forwards; for ``generate``, minus a timed one-token ``generate`` of the same batches), speedup over
``generate`` at the same concurrency, AAL, the share of forward tokens spent on rejected drafts, and,
for ours, the throughput the cost model predicts for the steps actually run (efficiency = measured /
predicted). The cost-model curve gives the machine's **ceiling**: with P prompt and G generated tokens
per request, a compute-bound forward costs at least ``(P + G) x`` its best per-token time, whatever the
method. Table, JSON, Markdown and a PNG of tokens/s against concurrency.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table
from tqdm import tqdm

import laser
from laser.cost import ForwardCost, forward_cost
from laser.engine import StepRecord
from benchmarks.report import generate_ids, machine_info, versions, wide_console, save_report
from benchmarks.suite import SuiteSettings, build_task_pools, pool_for, user_fixture
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset

log = logging.getLogger(__name__)

GENERATE = "transformers generate"


@dataclass(frozen=True)
class ThroughputMethod:
    name: str
    decoder: str  # "generate" or a registered decoder
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    pool: str | None = None  # "crp" | "global" (see benchmarks.suite.pool_for)


def default_methods(fixed_K: tuple[int, ...] = (8, 32)) -> list[ThroughputMethod]:
    greedy, relaxed = {"verification": "greedy"}, {"verification": "relaxed"}
    ms = [
        ThroughputMethod(GENERATE, "generate"),
        ThroughputMethod("autoregressive", "autoregressive"),
        ThroughputMethod("resd", "resd", {}, "global"),
        ThroughputMethod("laser greedy (auto)", "laser", greedy, "crp"),
        ThroughputMethod("laser relaxed (auto)", "laser", relaxed, "crp"),
    ]
    ms += [ThroughputMethod(f"laser relaxed K={K}", "laser", {**relaxed, "K": K}, "crp") for K in fixed_K]
    # the hand-set CPU default the adaptive budget replaced, for the batch-1 comparison
    ms.append(
        ThroughputMethod("laser relaxed K=32 min_prob=0.1", "laser", {**relaxed, "K": 32, "min_prob": 0.1}, "crp")
    )
    return ms


def select_rows(names: tuple[str, ...] | list[str] | None, known: list[str]) -> list[str]:
    """The rows to run, in the report's order (all when none named); unknown names are an error naming the
    known ones."""
    if not names:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(known)}")
    return [n for n in known if n in names]


@dataclass
class ThroughputSettings:
    model: str = laser.DEFAULT_MODEL
    threads: int = 2
    concurrency: tuple[int, ...] = (1, 4, 8, 16, 32, 64)
    min_prompts: int = 8  # prompts measured at low concurrency (so a level is not one request)
    max_new_tokens: int = 96
    old_users: int = 48
    max_prompt_tokens: int = 512
    fixed_K: tuple[int, ...] = (8, 32)
    remeasure_cost: bool = False  # time the cost model again instead of reading the cached one
    seed: int = 0
    device: str = "auto"  # auto: the GPU where CUDA is available, else the CPU (fp32 on both)

    def suite(self) -> SuiteSettings:
        return SuiteSettings(
            model=self.model,
            threads=self.threads,
            user_prompts=max(self.concurrency + (self.min_prompts,)),
            item_prompts=0,
            old_users=self.old_users,
            max_new_tokens=self.max_new_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            seed=self.seed,
        )


@dataclass
class Level:
    """One method at one concurrency."""

    tokens: int
    wall_s: float
    prefill_s: float
    outputs: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.tokens / max(self.wall_s - self.prefill_s, 1e-9)


def _generate_level(lm: laser.LoadedModel, prompts: list[list[int]], c: int, max_new: int) -> Level:
    """transformers greedy ``generate`` in static left-padded batches of ``c``; prefill timed apart."""
    tok = lm.tokenizer
    pad = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0
    outputs, wall, prefill = [], 0.0, 0.0
    for i in range(0, len(prompts), c):
        batch = prompts[i : i + c]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=lm.model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=lm.model.device)
        t0 = time.perf_counter()
        out = generate_ids(lm, ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
        wall += time.perf_counter() - t0
        t0 = time.perf_counter()
        generate_ids(lm, ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=pad)
        prefill += time.perf_counter() - t0
        outputs += [_until_eos(row[width:].tolist(), lm.eos_ids) for row in out]
    return Level(sum(map(len, outputs)), wall, prefill, outputs)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _engine_level(decoder: laser.Decoder, prompts: list[list[int]], pools: list[Any], c: int, max_new: int) -> Level:
    """One of our decoders through the continuous engine with ``c`` slots."""
    decoder.engine.log.clear()
    t0 = time.perf_counter()
    gens = decoder.generate_batch(prompts, max_new, pools, slots=c)
    wall = time.perf_counter() - t0
    log_ = decoder.engine.log
    return Level(
        sum(len(g.token_ids) for g in gens), wall, log_.prefill_s, [g.token_ids for g in gens], list(log_.steps)
    )


def level_metrics(level: Level, reference: Level, cost: ForwardCost) -> dict[str, Any]:
    """The reported figures of one level (module docstring)."""
    m: dict[str, Any] = {
        "tokens": level.tokens,
        "wall_s": level.wall_s,
        "prefill_s": level.prefill_s,
        "tokens_per_s": level.tokens_per_s,
        "decode_tokens_per_s": level.decode_tokens_per_s,
        "speedup_vs_generate": level.tokens_per_s / reference.tokens_per_s,
        "decode_speedup_vs_generate": level.decode_tokens_per_s / reference.decode_tokens_per_s,
        "identical_to_generate": sum(a == b for a, b in zip(level.outputs, reference.outputs)),
        "prompts": len(level.outputs),
    }
    if level.steps:
        steps = level.steps
        forward_tokens = sum(s.rows * s.nodes for s in steps)
        emitted = sum(s.rows + s.accepted for s in steps)
        predicted_s = sum(cost.time(s.rows, s.nodes) for s in steps)
        m.update(
            {
                "aal": emitted / sum(s.rows for s in steps),
                "mean_rows": float(np.mean([s.rows for s in steps])),
                "mean_nodes": float(np.mean([s.nodes for s in steps])),
                "rejected_draft_share": (sum(s.drafted - s.accepted for s in steps)) / forward_tokens,
                "padding_share": (forward_tokens - sum(s.rows + s.drafted for s in steps)) / forward_tokens,
                "forward_share_of_decode": sum(s.forward_s for s in steps) / sum(s.step_s for s in steps),
                "predicted_decode_tokens_per_s": emitted / predicted_s,
                "efficiency_vs_cost_model": (emitted / sum(s.step_s for s in steps)) / (emitted / predicted_s),
            }
        )
    return m


def ceiling(cost: ForwardCost, prompt_tokens: float, new_tokens: float) -> dict[str, float]:
    """The compute-bound bound: the best per-token forward time over the measured shapes."""
    per_token = min(t / (b * n) for b, row in zip(cost.rows, cost.seconds) for n, t in zip(cost.nodes, row))
    return {
        "best_seconds_per_token": per_token,
        "tokens_per_s_with_prefill": new_tokens / ((prompt_tokens + new_tokens) * per_token),
        "decode_tokens_per_s": 1.0 / per_token,
    }


def run_throughput(
    json_out: Path,
    s: ThroughputSettings,
    dataset: DatasetConfig | None = None,
    methods: list[ThroughputMethod] | None = None,
    cache_root: Path | None = None,
) -> dict[str, Any]:
    """Measure, print the table, write JSON, Markdown and the PNG; return the report."""
    torch.manual_seed(s.seed)
    torch.set_num_threads(s.threads)
    started = time.perf_counter()
    lm = laser.load_model(s.model, device=s.device, dtype="float32")
    dataset = dataset or DatasetConfig(seed=s.seed)
    task = user_fixture(lm, load_dataset(dataset), s.suite(), cache_root)
    pools = build_task_pools(task, s.suite())
    cost = forward_cost(lm.model) if not s.remeasure_cost else _remeasured(lm)
    methods = methods or default_methods(s.fixed_K)
    decoders = {m.name: laser.get_decoder(m.decoder, lm, **m.params) for m in methods if m.decoder != "generate"}
    groups = task.group_of()
    order = sorted(task.prompts)
    prompts = [task.prompts[e] for e in order]
    report: dict[str, Any] = {
        "settings": asdict(s),
        "machine": machine_info(),
        "versions": versions(),
        "dataset": dataset.model_dump(),
        "cost_model": asdict(cost),
        "levels": {},
    }
    _warm_up(lm, decoders, prompts[0])
    for c in tqdm(s.concurrency, desc="bench throughput", unit="level"):
        n = min(max(c, s.min_prompts), len(prompts))
        levels: dict[str, Level] = {}
        for m in methods:  # interleaved: every method at this concurrency before the next one
            if m.decoder == "generate":
                levels[m.name] = _generate_level(lm, prompts[:n], c, s.max_new_tokens)
            else:
                ps = [pool_for(_as_suite_method(m), task, groups.get(e), pools) for e in order[:n]]
                levels[m.name] = _engine_level(decoders[m.name], prompts[:n], ps, c, s.max_new_tokens)
        report["levels"][str(c)] = {name: level_metrics(lv, levels[GENERATE], cost) for name, lv in levels.items()}
    prompt_tokens = float(np.mean([len(p) for p in prompts]))
    new_tokens = float(
        np.mean([lv["tokens"] / lv["prompts"] for lv in report["levels"][str(s.concurrency[-1])].values()])
    )
    report["ceiling"] = {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        **ceiling(cost, prompt_tokens, new_tokens),
    }
    report["best"] = best_levels(report["levels"])
    report["targets"] = check_targets(report)
    report["duration_s"] = time.perf_counter() - started
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    print_throughput(report)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_throughput(report, json_out.with_suffix(".png")))
    save_report(report, json_out, markdown_throughput(report))
    return report


def _remeasured(lm: laser.LoadedModel) -> ForwardCost:
    """Time the cost model again (e.g. after the cached one was taken on a busy machine) and cache it."""
    from laser.cost import NODES, ROWS, cost_cache_dir, cost_key, measure

    cost = measure(lm.model, cost_key(lm.model), ROWS, NODES)
    cost.save(cost_cache_dir() / f"{cost.key}.json")
    return cost


def _as_suite_method(m: ThroughputMethod):
    from benchmarks.suite import Method

    return Method(m.name, m.decoder, m.params, m.pool)


def _warm_up(lm: laser.LoadedModel, decoders: dict[str, laser.Decoder], prompt: list[int]) -> None:
    """First calls pay for allocator growth and kernel selection: make them before timing."""
    device = lm.model.device
    generate_ids(
        lm,
        torch.tensor([prompt], device=device),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
        max_new_tokens=4,
        do_sample=False,
    )
    for d in decoders.values():
        d.generate_batch([prompt], 4)


def best_levels(levels: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each method's best concurrency by tokens/s (prefill included)."""
    out: dict[str, dict[str, Any]] = {}
    for c, methods in levels.items():
        for name, m in methods.items():
            if name not in out or m["tokens_per_s"] > out[name]["tokens_per_s"]:
                out[name] = {
                    "concurrency": int(c),
                    "tokens_per_s": m["tokens_per_s"],
                    "decode_tokens_per_s": m["decode_tokens_per_s"],
                }
    return out


def check_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The throughput issue's targets, each with its measured value."""
    levels, best = report["levels"], report["best"]
    relaxed, greedy = "laser relaxed (auto)", "laser greedy (auto)"
    out = []
    if relaxed in best and GENERATE in best:
        worst = min(levels[c][relaxed]["speedup_vs_generate"] for c in levels)
        out.append({"target": "relaxed LASER (auto) never below generate", "value": worst, "minimum": 1.0})
        out.append(
            {
                "target": "relaxed LASER best batch vs generate best batch",
                "value": best[relaxed]["tokens_per_s"] / best[GENERATE]["tokens_per_s"],
                "minimum": 1.5,
            }
        )
    if greedy in best and GENERATE in best:
        out.append(
            {
                "target": "greedy LASER best batch vs generate best batch",
                "value": best[greedy]["tokens_per_s"] / best[GENERATE]["tokens_per_s"],
                "minimum": 1.3,
            }
        )
        c = str(best[greedy]["concurrency"])
        m = levels[c][greedy]
        out.append(
            {
                "target": "greedy LASER tokens identical to generate (at its best batch)",
                "value": m["identical_to_generate"] / m["prompts"],
                "minimum": 1.0,
            }
        )
    old_default = "laser relaxed K=32 min_prob=0.1"
    if "1" in levels and old_default in levels["1"] and relaxed in levels["1"]:
        out.append(
            {
                "target": "batch-1 relaxed LASER (auto) vs the former CPU default (K=32, min_prob=0.1)",
                "value": levels["1"][relaxed]["tokens_per_s"] / levels["1"][old_default]["tokens_per_s"],
                "minimum": 1.0,
            }
        )
    effs = [levels[c][relaxed]["efficiency_vs_cost_model"] for c in levels if relaxed in levels[c]]
    if effs:
        out.append(
            {
                "target": "relaxed LASER throughput vs cost-model prediction (worst level)",
                "value": min(effs),
                "minimum": 0.8,
            }
        )
    for t in out:
        t["met"] = t["value"] >= t["minimum"]
    return out


def print_throughput(report: dict[str, Any]) -> None:
    console = wide_console()
    table = Table(
        title=f"bench throughput: {report['settings']['model']}, {report['settings']['threads']} threads, "
        f"{report['settings']['max_new_tokens']} new tokens max (tok/s with prefill | decode-only)"
    )
    table.add_column("method", justify="right")
    for c in report["levels"]:
        table.add_column(f"c={c}", justify="right")
    table.add_column("best", justify="right")
    names = list(next(iter(report["levels"].values())))
    for name in names:
        cells = []
        for c, methods in report["levels"].items():
            m = methods[name]
            aal = f" aal {m['aal']:.2f}" if "aal" in m else ""
            cells.append(
                f"{m['tokens_per_s']:.1f} | {m['decode_tokens_per_s']:.1f}\n{m['speedup_vs_generate']:.2f}x{aal}"
            )
        b = report["best"][name]
        table.add_row(name, *cells, f"{b['tokens_per_s']:.1f} @ {b['concurrency']}")
    console.print(table)
    ce = report["ceiling"]
    console.print(
        f"ceiling (compute-bound, P={ce['prompt_tokens']:.0f}, G={ce['new_tokens']:.0f}): "
        f"{ce['tokens_per_s_with_prefill']:.1f} tok/s with prefill, {ce['decode_tokens_per_s']:.1f} decode-only"
    )
    for t in report["targets"]:
        console.print(f"{'met ' if t['met'] else 'MISS'}  {t['target']}: {t['value']:.2f} (needs >= {t['minimum']})")


def markdown_throughput(report: dict[str, Any]) -> str:
    levels = report["levels"]
    names = list(next(iter(levels.values())))
    lines = ["| method | " + " | ".join(f"c={c}" for c in levels) + " | best |", "|---|" + "---:|" * (len(levels) + 1)]
    for name in names:
        cells = [
            f"{levels[c][name]['tokens_per_s']:.1f} ({levels[c][name]['speedup_vs_generate']:.2f}x)" for c in levels
        ]
        b = report["best"][name]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {b['tokens_per_s']:.1f} @ {b['concurrency']} |")
    lines += [
        "",
        "Decode-only tokens/s (prefill forwards excluded):",
        "",
        "| method | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|" + "---:|" * len(levels),
    ]
    for name in names:
        lines.append(
            f"| {name} | " + " | ".join(f"{levels[c][name]['decode_tokens_per_s']:.1f}" for c in levels) + " |"
        )
    ce = report["ceiling"]
    lines += [
        "",
        f"Ceiling (compute-bound, P={ce['prompt_tokens']:.0f}, G={ce['new_tokens']:.0f}): "
        f"{ce['tokens_per_s_with_prefill']:.1f} tok/s with prefill, {ce['decode_tokens_per_s']:.1f} decode-only.",
        "",
    ]
    lines += target_lines(report)
    return "\n".join(lines) + "\n"


def target_lines(report: dict[str, Any]) -> list[str]:
    """One Markdown line per target of the report: met or missed, with its measured value."""
    return [
        f"- {'met' if t['met'] else '**missed**'}: {t['target']}: {t['value']:.2f} (needs >= {t['minimum']})"
        for t in report["targets"]
    ]


def plot_levels(ax: Any, report: dict[str, Any], title: str) -> None:
    """Tokens/s against concurrency, one line per method, on ``ax``."""
    conc = [int(c) for c in report["levels"]]
    for name in next(iter(report["levels"].values())):
        ax.plot(conc, [report["levels"][str(c)][name]["tokens_per_s"] for c in conc], marker="o", label=name)
    ax.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="tokens/s (prefill included)", title=title)
    ax.set_xticks(conc, [str(c) for c in conc])


def plot_throughput(report: dict[str, Any], path: Path) -> Path:
    """Tokens/s against concurrency (one line per method), and the cost-model curve with its ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cx) = plt.subplots(1, 2, figsize=(13, 4.8))
    plot_levels(ax, report, "throughput vs concurrency")
    ax.axhline(report["ceiling"]["tokens_per_s_with_prefill"], color="grey", linestyle="--", label="ceiling")
    ax.legend(fontsize=7)
    cost = report["cost_model"]
    for b, row in zip(cost["rows"], cost["seconds"]):
        cx.plot([b * n for n in cost["nodes"]], [1000 * t for t in row], marker=".", label=f"{b} rows")
    cx.set(
        xscale="log",
        yscale="log",
        xlabel="tokens in the forward (rows x tree nodes)",
        ylabel="forward ms",
        title="cost model",
    )
    cx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
