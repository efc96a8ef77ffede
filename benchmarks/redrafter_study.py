"""The `redrafter` study of `laser bench suite`: ReDrafter on the user task over beam width x beam length,
with and without prefix deduplication, against transformers greedy ``generate``.

Reported per setting: tokens per step (AAL), the packed tree length (nodes per drafting step, root
included) against BW x L, tokens/s, speedup against ``generate``, the share of each step spent drafting
(head beam search + packing, over the step's wall time), and whether the tokens equal ``generate``'s.
The head's training curve (written by ``laser train-redrafter``) is attached. Measured prompts: new
histories of a seeded sample of users (the suite's user task without its pools).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import polars as pl

import laser
from laser.decoders.redrafter.head import head_path
from benchmarks.fixture import encode_user_prompts
from benchmarks.report import Run, machine_info, print_methods, summarise, versions, wide_console, save_report
from pipelines.data.schema import Dataset
from pipelines.data.split import split_old_new

log = logging.getLogger(__name__)

REFERENCE = "transformers generate"


def method_name(width: int, length: int, dedup: bool) -> str:
    return f"redrafter BW={width} L={length}{'' if dedup else ' no-dedup'}"


def study_methods(s: Any):
    """generate, autoregressive, then the grid; without dedup only where BW > 1 (one beam has nothing to share)
    and L is in ``redrafter_nodedup_lengths`` (dedup changes the tree's size, not the tokens)."""
    from benchmarks.suite import Method

    ms = [Method(REFERENCE, "generate"), Method("autoregressive", "autoregressive")]
    for dedup in (True, False):
        for length in s.redrafter_lengths:
            for width in s.redrafter_widths:
                if dedup or (width > 1 and length in s.redrafter_nodedup_lengths):
                    ms.append(
                        Method(
                            method_name(width, length, dedup),
                            "redrafter",
                            {"head": s.redrafter_head, "beam_width": width, "beam_length": length, "dedup": dedup},
                        )
                    )
    return ms


def user_prompts(lm: laser.LoadedModel, ds: Dataset, s: Any) -> dict[str, list[int]]:
    """{user: prompt ids} of a seeded sample of new histories (full history up to the end of the new part)."""
    from benchmarks.suite import _sample

    split = split_old_new(ds, seed=s.seed, max_hist=s.max_hist)
    measured = _sample(split.new_interactions["user_id"].unique().to_list(), s.user_prompts, s.seed)
    history = pl.concat([split.old_interactions, split.new_interactions])
    return encode_user_prompts(lm, history, ds, measured, s.max_prompt_tokens)


def tree_metrics(runs: list[Run], width: int, length: int) -> dict[str, Any]:
    """Packed tree length per drafting step and the share of decoding time spent drafting."""
    stats = [r.stats for r in runs if r.stats is not None]
    drafted = [n for st in stats for n in st.drafted_per_step if n > 0]
    decode_s = sum(st.decode_s for st in stats)
    return {
        "beam_width": width,
        "beam_length": length,
        "bw_x_l": width * length,
        "tree_nodes_per_step": 1 + sum(drafted) / len(drafted) if drafted else 1.0,
        "undeduplicated_nodes": 1 + width * (length - 1),
        "drafting_share_of_step": sum(st.retrieval_s for st in stats) / decode_s if decode_s else None,
        "drafting_ms_per_step": 1000
        * sum(st.retrieval_s for st in stats)
        / max(1, sum(st.target_forwards for st in stats)),
    }


def training_curve(head: str) -> dict[str, Any] | None:
    """The head's training summary and curve (JSON and PNG beside the head file), when present."""
    path = head_path(head).with_suffix(".json")
    if not path.exists():
        return None
    blob = json.loads(path.read_text())
    hist = blob.pop("history", [])
    stride = max(1, len(hist) // 50)
    return {**blob, "curve": [{k: h[k] for k in ("step", "loss", "accuracy")} for h in hist[::stride] + hist[-1:]]}


def run_redrafter_study(lm: laser.LoadedModel, prompts: dict[str, list[int]], s: Any, json_out: Path) -> dict[str, Any]:
    """Measure the grid on ``prompts`` (:func:`user_prompts`); print the table; write JSON, Markdown and a PNG."""
    from benchmarks.suite import TaskFixture, measure_task

    if not s.redrafter_head:
        raise ValueError("the redrafter study needs a trained head: --redrafter-head NAME (laser train-redrafter)")
    head_path_ = head_path(s.redrafter_head)
    if not head_path_.exists():
        raise ValueError(
            f"ReDrafter head {s.redrafter_head!r} not found at {head_path_}: train it with "
            "`laser train-redrafter CONFIG`"
        )
    no_groups = pl.DataFrame(schema={"entity_id": pl.Utf8, "group_id": pl.Utf8, "pool_kind": pl.Utf8}).to_arrow()
    task = TaskFixture("user", "none", prompts, {}, no_groups)  # no pools in this study
    methods = study_methods(s)
    rows = measure_task(lm, task, methods, {}, s)
    metrics = summarise(rows, REFERENCE)
    for m in methods:
        if m.decoder == "redrafter":
            metrics[m.name].update(
                tree_metrics(rows[m.name], m.params["beam_width"], m.params["beam_length"]), dedup=m.params["dedup"]
            )
    report = {
        "study": "redrafter",
        "head": s.redrafter_head,
        "model": lm.name,
        "machine": machine_info(),
        "versions": versions(),
        "prompts": len(task.prompts),
        "max_new_tokens": s.max_new_tokens,
        "threads": s.threads,
        "methods": metrics,
        "training": training_curve(s.redrafter_head),
    }
    report["targets"] = study_targets(metrics)
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    print_methods(
        f"redrafter study: {lm.name}, {s.threads} threads, {len(task.prompts)} prompts, "
        f"{s.max_new_tokens} new tokens max",
        metrics,
        wide_console(),
    )
    json_out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_study(metrics, json_out.with_name(json_out.stem + "-redrafter.png")))
    save_report(report, json_out, markdown(report))
    return report


def study_targets(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, on the best greedy setting that equals ``generate``."""
    ours = {n: m for n, m in metrics.items() if n.startswith("redrafter")}
    best_aal = max(ours.values(), key=lambda m: m["aal"] or 0)
    same = {n: m for n, m in ours.items() if m["identical_to_greedy"]}
    fastest = max(same.items(), key=lambda kv: kv[1]["speedup_vs_generate"]) if same else None
    return [
        {
            "target": "tokens per step >= 2.5 (best setting)",
            "value": best_aal["aal"],
            "minimum": 2.5,
            "met": (best_aal["aal"] or 0) >= 2.5,
        },
        {
            "target": "speedup vs generate >= 1.3 with identical tokens",
            "setting": fastest[0] if fastest else None,
            "value": fastest[1]["speedup_vs_generate"] if fastest else 0.0,
            "minimum": 1.3,
            "met": bool(fastest and fastest[1]["speedup_vs_generate"] >= 1.3),
        },
        {
            "target": "every setting identical to generate",
            "value": len(same),
            "minimum": len(ours),
            "met": len(same) == len(ours),
        },
    ]


def markdown(report: dict[str, Any]) -> str:
    head = (
        "| setting | tokens/step | tree nodes/step | BW x L | no-dedup nodes | tokens/s | speedup | "
        "drafting share | = generate |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, m in report["methods"].items():
        if not name.startswith("redrafter"):
            lines.append(
                f"| {name} | {m['aal'] or 1:.2f} | 1 | - | - | {m['tokens_per_s']:.1f} | "
                f"{m['speedup_vs_generate']:.2f}x | - | {'yes' if m['identical_to_greedy'] else 'no'} |"
            )
            continue
        lines.append(
            f"| {name} | {m['aal']:.2f} | {m['tree_nodes_per_step']:.1f} | {m['bw_x_l']} | "
            f"{m['undeduplicated_nodes']} | {m['tokens_per_s']:.1f} | {m['speedup_vs_generate']:.2f}x | "
            f"{100 * (m['drafting_share_of_step'] or 0):.0f}% | "
            f"{'yes' if m['identical_to_greedy'] else 'no'} |"
        )
    lines += [""] + [
        f"- {'met' if t['met'] else '**missed**'}: {t['target']}: {t['value']:.2f}" for t in report["targets"]
    ]
    return "\n".join(lines) + "\n"


def plot_study(metrics: dict[str, dict[str, Any]], png: Path) -> Path:
    """Tokens per step, speedup and packed tree size against beam width, one line per length (dedup)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = [m for n, m in metrics.items() if n.startswith("redrafter")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for length in sorted({m["beam_length"] for m in ours}):
        for dedup, style in ((True, "-o"), (False, "--x")):
            pts = sorted((m["beam_width"], m) for m in ours if m["beam_length"] == length and m["dedup"] == dedup)
            if not pts:
                continue
            xs = [w for w, _ in pts]
            label = f"L={length}{'' if dedup else ' no-dedup'}"
            axes[0].plot(xs, [m["aal"] for _, m in pts], style, label=label)
            axes[1].plot(xs, [m["speedup_vs_generate"] for _, m in pts], style, label=label)
            axes[2].plot(xs, [m["tree_nodes_per_step"] for _, m in pts], style, label=label)
    for ax, title in zip(axes, ("tokens per step", "speedup vs generate", "tree nodes per step")):
        ax.set(xlabel="beam width", title=title)
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def run_redrafter_bench(json_out: Path, s: Any, dataset: Any = None) -> dict[str, Any]:
    """The redrafter study on its own: model, dataset, prompts, measurements (`laser bench suite --study
    redrafter`, or beside the suite with ``--redrafter-head``)."""
    import torch

    from pipelines.data.config import DatasetConfig
    from pipelines.data.load import load_dataset

    torch.set_num_threads(s.threads)
    lm = laser.load_model(s.model, device=s.device, dtype="float32")
    ds = load_dataset(dataset or DatasetConfig(seed=s.seed))
    return run_redrafter_study(lm, user_prompts(lm, ds, s), s, json_out)
