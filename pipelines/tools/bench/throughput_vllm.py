"""`laser bench throughput --engine vllm`: vLLM with and without LASER as its drafter, beside our engine.

Same prompts and pools as `laser bench throughput` (new user histories; pools of earlier profiles routed
by collaborative group). At each concurrency c every method decodes the first ``max(c, min_prompts)``
prompts with at most c in flight:

- ``transformers generate`` (static batches of c) and ``laser relaxed (auto)`` (our engine, c slots),
  in this process;
- ``vllm`` (no speculation), ``vllm ngram`` (prompt lookup, 8 tokens, n 2-4), ``vllm suffix`` (Arctic
  Inference's suffix decoding; only where ``arctic_inference`` imports), ``laser-vllm greedy`` and
  ``laser-vllm relaxed`` (LASER as vLLM's drafter, routed pools, draft length ``auto`` from the vLLM
  step-cost model measured first): each in a fresh process with a fresh engine (``max_num_seqs`` = c),
  so no level inherits another's prefix cache or suffix tree (docs/engines.md: the measurement trap).

JSON: ``levels[c][method].tokens_per_s`` (prefill included, wall), ``decode_tokens_per_s`` (wall minus a
prefill estimate: the same prompts for one token, prefix cache reset), ``aal``,
``speedup_vs_vllm``, ``identical_to_vllm`` (prompts whose tokens equal vLLM greedy's); ``targets``
(the engine issue's), ``cost_model`` (the vLLM step cost), load averages before and after. Markdown and a
PNG (tokens/s against concurrency; the measured step-cost curve) beside the JSON.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import laser
from laser.drafting import Drafter
from laser.tree import DraftTree
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset
from pipelines.tools.bench.report import machine_info, versions, wide_console
from pipelines.tools.bench.suite import build_task_pools, pool_for, user_fixture
from pipelines.tools.bench.throughput import (GENERATE, ThroughputMethod, ThroughputSettings, _as_suite_method,
                                              _engine_level, _generate_level, _warm_up, plot_levels, target_lines)

log = logging.getLogger(__name__)

VLLM = "vllm"
HF_RELAXED = "laser relaxed (auto)"
HF_CHAINS = "laser relaxed (auto), chains"  # our engine drafting only what vLLM can verify: a tree's worth
VLLM_METHODS: dict[str, dict[str, Any]] = {
    "vllm": {"speculation": None},
    "vllm ngram": {"speculation": "ngram", "max_draft": 8},
    "vllm suffix": {"speculation": "suffix", "max_draft": 16},
    "laser-vllm greedy": {"speculation": "laser", "draft_len": "auto", "verification": "greedy", "pool": "crp"},
    "laser-vllm relaxed": {"speculation": "laser", "draft_len": "auto", "verification": "relaxed", "k": 2,
                           "p": 0.1, "pool": "crp"},
}


class ChainSource:
    """A pool whose drafters keep only their tree's first path: our engine verifying chains, as vLLM does,
    so that the ``HF_CHAINS`` row against ``HF_RELAXED`` measures what a draft tree adds."""

    def __init__(self, pool: Any):
        self.pool = pool

    def open(self, prompt_ids, max_nodes: int, n_max: int, min_prob: float) -> Drafter:
        return _ChainDrafter(self.pool.open(prompt_ids, max_nodes, n_max, min_prob))


class _ChainDrafter(Drafter):
    def __init__(self, inner: Drafter):
        self.inner = inner

    def propose(self, context, budget: int | None = None) -> DraftTree:
        return DraftTree.chain(context[-1], self.inner.propose(context, budget).first_path())

    def commit(self, new_tokens, hidden=None) -> None:
        self.inner.commit(new_tokens, hidden)

    def close(self) -> None:
        self.inner.close()


def suffix_available() -> str | None:
    """None if vLLM's suffix decoding can run here, else why not."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the method is absent
        return f"arctic_inference does not import ({type(exc).__name__}: {exc})"
    return None


@dataclass
class VllmThroughputSettings(ThroughputSettings):
    max_model_len: int = 1024
    kv_cache_gib: float = 2


def _subprocess(spec: dict[str, Any], measure: bool = False) -> dict[str, Any]:
    """One level (or the step-cost measurement) on a fresh vLLM engine in a spawned process."""
    from pipelines.tools.bench.vllm_level import in_fresh_process, measure_cost, run_level

    return in_fresh_process(measure_cost if measure else run_level, spec)


def run_throughput_vllm(json_out: Path, s: VllmThroughputSettings, dataset: DatasetConfig | None = None,
                        cache_root: Path | None = None) -> dict[str, Any]:
    """Measure, print the table, write JSON, Markdown and the PNG; return the report."""
    from laser.cost import ForwardCost

    torch.manual_seed(s.seed)
    torch.set_num_threads(s.threads)
    started = time.perf_counter()
    load_before = machine_info()["load_average"]
    lm = laser.load_model(s.model, device="cpu", dtype="float32")
    dataset = dataset or DatasetConfig(seed=s.seed)
    task = user_fixture(lm, load_dataset(dataset), s.suite(), cache_root)
    pools = build_task_pools(task, s.suite())
    groups = task.group_of()
    order = sorted(task.prompts)
    prompts = [task.prompts[e] for e in order]
    model_dir = laser.models._resolve(s.model)
    why_no_suffix = suffix_available()
    methods = [m for m in VLLM_METHODS if m != "vllm suffix" or why_no_suffix is None]
    relaxed = ThroughputMethod(HF_RELAXED, "laser", {"verification": "relaxed"}, "crp")
    hf_decoder = laser.get_decoder("laser", lm, verification="relaxed")
    _warm_up(lm, {HF_RELAXED: hf_decoder}, prompts[0])
    base = {"model": model_dir, "threads": s.threads, "max_model_len": s.max_model_len, "kv_cache_gib": s.kv_cache_gib,
            "max_new_tokens": s.max_new_tokens, "concurrency": max(s.concurrency),
            "vocab": len(lm.tokenizer) if lm.tokenizer is not None else 32000}
    log.info("measuring the vLLM step-cost model")
    cost_dict = _subprocess(base, measure=True)
    cost = ForwardCost(**cost_dict)
    report: dict[str, Any] = {"settings": asdict(s), "engine": "vllm", "machine": machine_info(), "versions": versions(),
                              "dataset": dataset.model_dump(), "cost_model": cost_dict, "levels": {},
                              "absent": {} if why_no_suffix is None else {"vllm suffix": why_no_suffix}}
    report["machine"]["load_average_before"] = load_before
    try:
        import vllm

        report["versions"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    for c in s.concurrency:
        n = min(max(c, s.min_prompts), len(prompts))
        ps = [pool_for(_as_suite_method(relaxed), task, groups.get(e), pools) for e in order[:n]]
        level: dict[str, dict[str, Any]] = {}
        gen = _generate_level(lm, prompts[:n], c, s.max_new_tokens)
        level[GENERATE] = _metrics(gen.tokens, gen.wall_s, gen.prefill_s, gen.outputs)
        ours = _engine_level(hf_decoder, prompts[:n], ps, c, s.max_new_tokens)
        level[HF_RELAXED] = _metrics(ours.tokens, ours.wall_s, ours.prefill_s, ours.outputs, aal=_aal(ours))
        chains = _engine_level(hf_decoder, prompts[:n], [ChainSource(p) if p is not None else None for p in ps], c,
                               s.max_new_tokens)
        level[HF_CHAINS] = _metrics(chains.tokens, chains.wall_s, chains.prefill_s, chains.outputs, aal=_aal(chains))
        for name in methods:
            m = VLLM_METHODS[name]
            keys, used = [None] * n, {}
            if m.get("pool"):
                for i, e in enumerate(order[:n]):
                    pool = ps[i]
                    if pool is not None:
                        keys[i] = f"crp/{groups.get(e)}"
                        used[keys[i]] = pool
            spec = {**base, "method": m, "concurrency": c, "prompts": prompts[:n], "pool_keys": keys,
                    "pools": used, "cost": cost if m.get("draft_len") == "auto" else None}
            log.info("c=%d %s", c, name)
            r = _subprocess(spec)
            level[name] = _metrics(r["tokens"], r["wall_s"], r["prefill_s"], r["outputs"], aal=r["aal"],
                                   start_s=r["start_s"], warm_s=r["warm_s"], draft=r["mean_draft_tokens_per_step"])
        ref = level[VLLM]
        for name, lv in level.items():
            lv["speedup_vs_vllm"] = lv["tokens_per_s"] / ref["tokens_per_s"]
            lv["speedup_vs_generate"] = lv["tokens_per_s"] / level[GENERATE]["tokens_per_s"]
            lv["identical_to_vllm"] = sum(a == b for a, b in zip(lv.pop("_outputs"), ref["_outputs_ref"])) \
                if "_outputs" in lv else None
        for lv in level.values():
            lv.pop("_outputs_ref", None)
        report["levels"][str(c)] = level
        print(f"c={c}: " + ", ".join(f"{k} {v['tokens_per_s']:.1f}" for k, v in level.items()), flush=True)
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({**report, "complete": False}, indent=2))  # the levels so far, should a later one fail
    report["targets"] = check_vllm_targets(report)
    report["complete"] = True
    report["duration_s"] = time.perf_counter() - started
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    print_vllm_throughput(report)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_vllm_throughput(report, json_out.with_suffix(".png")))
    json_out.write_text(json.dumps(report, indent=2))
    json_out.with_suffix(".md").write_text(markdown_vllm_throughput(report))
    return report


def _aal(level: Any) -> float | None:
    """Tokens per target forward of one of our engine's levels."""
    rows = sum(st.rows for st in level.steps)
    return sum(st.rows + st.accepted for st in level.steps) / rows if rows else None


def _metrics(tokens: int, wall: float, prefill: float, outputs: list[list[int]], **extra: Any) -> dict[str, Any]:
    m = {"tokens": tokens, "wall_s": wall, "prefill_s": prefill, "tokens_per_s": tokens / wall,
         "decode_tokens_per_s": tokens / max(wall - prefill, 1e-9), "prompts": len(outputs),
         "_outputs": outputs, "_outputs_ref": outputs}
    m.update({k: v for k, v in extra.items() if v is not None})
    return m


def check_vllm_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The engine issue's targets, each with its measured value."""
    levels = report["levels"]
    rel, grd = "laser-vllm relaxed", "laser-vllm greedy"
    out: list[dict[str, Any]] = []

    def ratio(a: str, b: str, cs: list[str]) -> float | None:
        vals = [levels[c][a]["tokens_per_s"] / levels[c][b]["tokens_per_s"] for c in cs if a in levels[c] and b in levels[c]]
        return min(vals) if vals else None

    cs = list(levels)
    for target, value, minimum in (
            ("laser-vllm relaxed never below vllm (worst concurrency)", ratio(rel, VLLM, cs), 1.0),
            ("laser-vllm relaxed vs vllm at concurrency 1 and 4 (worse of the two)",
             ratio(rel, VLLM, [c for c in cs if c in ("1", "4")]), 1.3),
            ("laser-vllm relaxed ahead of vllm ngram (worst concurrency)", ratio(rel, "vllm ngram", cs), 1.0),
            ("laser-vllm relaxed ahead of vllm suffix (worst concurrency)", ratio(rel, "vllm suffix", cs), 1.0)):
        if value is not None:
            out.append({"target": target, "value": value, "minimum": minimum})
    ours, theirs = (HF_RELAXED, rel), [n for n in VLLM_METHODS if not n.startswith("laser-vllm")]
    best = [max(levels[c][a]["tokens_per_s"] for a in ours if a in levels[c])
            / max(levels[c][b]["tokens_per_s"] for b in theirs if b in levels[c]) for c in cs]
    if best:
        out.append({"target": "the better of our two engines ahead of every vLLM row (worst concurrency)",
                    "value": min(best), "minimum": 1.0})
    ident = [levels[c][grd]["identical_to_vllm"] / levels[c][grd]["prompts"] for c in cs if grd in levels[c]]
    if ident:
        out.append({"target": "laser-vllm greedy tokens identical to vllm greedy (worst concurrency)",
                    "value": min(ident), "minimum": 1.0})
    for t in out:
        t["met"] = t["value"] >= t["minimum"]
    return out


def print_vllm_throughput(report: dict[str, Any]) -> None:
    from rich.table import Table

    console = wide_console()
    st = report["settings"]
    table = Table(title=f"bench throughput --engine vllm: {st['model']}, {st['threads']} threads, "
                        f"{st['max_new_tokens']} new tokens max (tok/s with prefill; x vllm; aal)")
    table.add_column("method", justify="right")
    for c in report["levels"]:
        table.add_column(f"c={c}", justify="right")
    for name in next(iter(report["levels"].values())):
        cells = []
        for lv in report["levels"].values():
            m = lv[name]
            aal = f" aal {m['aal']:.2f}" if m.get("aal") is not None else ""
            cells.append(f"{m['tokens_per_s']:.1f}\n{m['speedup_vs_vllm']:.2f}x{aal}")
        table.add_row(name, *cells)
    console.print(table)
    for name, why in report["absent"].items():
        console.print(f"absent: {name}: {why}")
    for t in report["targets"]:
        console.print(f"{'met ' if t['met'] else 'MISS'}  {t['target']}: {t['value']:.2f} (needs >= {t['minimum']})")


def markdown_vllm_throughput(report: dict[str, Any]) -> str:
    levels = report["levels"]
    names = list(next(iter(levels.values())))
    m = report["machine"]
    lines = [f"Load average before {m.get('load_average_before')}, after {m.get('load_average_after')}.", "",
             "Tokens/s with prefill (x vLLM at the same concurrency):", "",
             "| method | " + " | ".join(f"c={c}" for c in levels) + " |", "|---|" + "---:|" * len(levels)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{levels[c][name]['tokens_per_s']:.1f} ({levels[c][name]['speedup_vs_vllm']:.2f}x)" for c in levels) + " |")
    lines += ["", "Decode-only tokens/s (a prefill estimate subtracted) and AAL (vLLM methods with drafting):", "",
              "| method | " + " | ".join(f"c={c}" for c in levels) + " |", "|---|" + "---:|" * len(levels)]
    for name in names:
        cells = [f"{levels[c][name]['decode_tokens_per_s']:.1f}"
                 + (f" (aal {levels[c][name]['aal']:.2f})" if levels[c][name].get("aal") is not None else "")
                 for c in levels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- absent: {n}: {why}" for n, why in report["absent"].items()]
    lines += target_lines(report)
    return "\n".join(lines) + "\n"


def plot_vllm_throughput(report: dict[str, Any], path: Path) -> Path:
    """Tokens/s against concurrency per method, and the measured vLLM step-cost curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cx) = plt.subplots(1, 2, figsize=(13, 4.8))
    plot_levels(ax, report, "throughput vs concurrency (vLLM engine)")
    ax.legend(fontsize=7)
    cost = report["cost_model"]
    for b, row in zip(cost["rows"], cost["seconds"]):
        cx.plot(cost["nodes"], [1000 * t for t in row], marker=".", label=f"{b} rows")
    cx.set(xlabel="tokens per row in the step (1 + draft length)", ylabel="vLLM step ms",
           title="measured vLLM step cost")
    cx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
