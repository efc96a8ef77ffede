"""Markdown and PNG of a `laser ctr-eval` result (the dict :func:`pipelines.ctr.evaluate.run_ctr_eval` returns).

The Markdown holds the sample, one row per (knowledge source, model) with test AUC and log loss as
mean [95% interval] over the seeds, the paired differences vs no knowledge and vs the reference, and
the lossless verdicts. The PNG plots the same means with their intervals, one panel per metric.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipelines.ctr.config import MODEL_LABELS


def _num(x: float | None, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _ci(ci: list | tuple | None, signed: bool = False) -> str:
    if not ci or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in ci):
        return "n/a"
    return f"[{_num(ci[0], signed)}, {_num(ci[1], signed)}]"


def markdown(result: dict, title: str | None = None) -> str:
    """The result as Markdown: sample, table with 95% intervals, paired differences, verdicts."""
    cfg = result["config"]
    models, seeds, ref = cfg["models"], cfg["seeds"], result["reference"]
    lines = _intro_lines(result, title, seeds)
    lines += _table_lines(result, models)
    lines += _delta_lines(result.get("deltas", {}), models)
    lines += _lossless_lines(result, ref)
    if result.get("verdict"):
        lines += ["", f"Verdict: {result['verdict']}"]
    return "\n".join(lines) + "\n"


def _intro_lines(result: dict, title: str | None, seeds: list[int]) -> list[str]:
    """The title and the run's setting: sample, CTR samples and split, knowledge rows, wall time."""
    cfg = result["config"]
    lines = [f"# {title or 'Downstream CTR on ' + str(result['dataset'])}", ""]
    sample = result.get("sample", {})
    if sample:
        lines.append("Sample: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sample.items()) + ".")
    lines.append(
        f"CTR samples (one per new interaction, label = rating >= {cfg.get('rating_threshold') or cfg['dataset']['min_positive_rating']}): "
        f"{result['n_samples']}, positive rate {result['positive_rate']:.3f}; users split "
        f"{'/'.join(str(f) for f in cfg['split_fractions'])} train/validation/test per seed; seeds {seeds}; "
        f"encoder {result['encoder']}."
    )
    if result.get("knowledge_rows"):
        lines.append(
            "Knowledge rows per source: "
            + ", ".join(f"{s} {n['user']} users + {n['item']} items" for s, n in result["knowledge_rows"].items())
            + "."
        )
    if result.get("wall_s") is not None:
        lines.append(f"Wall time of ctr-eval: {result['wall_s']:.0f} s.")
    return lines


def _table_lines(result: dict, models: list[str]) -> list[str]:
    """Test AUC and log loss per (source, model) with their 95% intervals."""
    lines = [
        "",
        "Test AUC and log loss: mean over seeds [Student-t 95% interval].",
        "",
        "| knowledge | model | AUC | AUC 95% CI | log loss | log loss 95% CI |",
        "|---|---|---|---|---|---|",
    ]
    for source, per_model in result["table"].items():
        for m in models:
            if m not in per_model:
                continue
            r = per_model[m]
            lines.append(
                f"| {source} | {MODEL_LABELS.get(m, m)} | {_num(r['auc_mean'])} | {_ci(r.get('auc_ci95'))} | "
                f"{_num(r['logloss_mean'])} | {_ci(r.get('logloss_ci95'))} |"
            )
    return lines


def _delta_lines(deltas: dict, models: list[str]) -> list[str]:
    """The paired differences per (source, baseline, model); none without deltas."""
    if not deltas:
        return []
    lines = [
        "",
        "Paired differences (same seed: same user split, initial weights and batch order), mean [95% interval]:",
        "",
        "| knowledge | vs | model | ΔAUC | ΔAUC 95% CI | Δlog loss | Δlog loss 95% CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for source, per_base in deltas.items():
        for base, per_model in per_base.items():
            for m in models:
                if m not in per_model:
                    continue
                d = per_model[m]
                lines.append(
                    f"| {source} | {base.removeprefix('vs_')} | {MODEL_LABELS.get(m, m)} | "
                    f"{_num(d['auc'], True)} | {_ci(d['auc_ci95'], True)} | {_num(d['logloss'], True)} | "
                    f"{_ci(d['logloss_ci95'], True)} |"
                )
    return lines


def _lossless_lines(result: dict, ref: str) -> list[str]:
    """One lossless-or-not line per source vs the reference; none without verdicts."""
    if not result["verdicts"]:
        return []
    lines = ["", f"Lossless vs {ref} (|mean paired ΔAUC| <= {result['tolerance']} for every model):", ""]
    for source, v in result["verdicts"].items():
        lines.append(
            f"- {source}: {'lossless' if v['lossless'] else 'differs'} ("
            + ", ".join(f"{MODEL_LABELS.get(m, m)} {_num(d, True)}" for m, d in v["delta_auc"].items())
            + ")"
        )
    return lines


def plot(result: dict, path: Path) -> Path:
    """Test AUC and log loss per model and source: means with 95% interval bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in result["config"]["models"]]
    sources = list(result["table"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(1, len(sources))
    for ax, metric, label in ((axes[0], "auc", "test AUC"), (axes[1], "logloss", "test log loss")):
        for i, source in enumerate(sources):
            xs, ys, lo, hi = [], [], [], []
            for j, m in enumerate(models):
                r = result["table"][source].get(m)
                if r is None or r[f"{metric}_mean"] is None:
                    continue
                mean = r[f"{metric}_mean"]
                ci = r.get(f"{metric}_ci95") or [None, None]
                xs.append(j + (i - (len(sources) - 1) / 2) * width)
                ys.append(mean)
                lo.append(0.0 if ci[0] is None or math.isnan(ci[0]) else mean - ci[0])
                hi.append(0.0 if ci[1] is None or math.isnan(ci[1]) else ci[1] - mean)
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, label=source)
        ax.set_xticks(range(len(models)), [MODEL_LABELS.get(m, m) for m in models])
        ax.set(ylabel=label, title=f"{label}, mean and 95% CI over {len(result['config']['seeds'])} seeds")
        ax.grid(axis="y", lw=0.4)
    axes[0].legend(title="knowledge", fontsize=8)
    fig.suptitle(f"Downstream CTR on {result['dataset']}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
