"""PNG plots of the suite's studies (matplotlib, Agg backend), written next to the JSON report.

``<stem>-ablation.png`` (Table 3), ``<stem>-verification.png`` (Figure 6), ``<stem>-pool-size.png``
(Figure 2) and ``<stem>-draft-budget.png`` (tokens/s and AAL vs K).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_studies(report: dict[str, Any], json_out: Path) -> list[Path]:
    """Write the study plots of a suite report; returns their paths (none when there is no user task)."""
    studies = report.get("studies")
    methods = report["tasks"].get("user", {}).get("methods")
    if not studies or not methods:
        return []
    stem = json_out.with_suffix("")
    title = f"{report['settings']['model']}, {report['settings']['threads']} threads"
    out = []
    for name, draw in (
        ("ablation", _ablation),
        ("verification", _verification),
        ("pool-size", _pool_size),
        ("draft-budget", _draft_budget),
    ):
        fig = draw(studies, methods, title)
        path = Path(f"{stem}-{name}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        out.append(path)
    return out


def _bars(ax, labels: list[str], values: list[float], ylabel: str, fmt: str = "{:.1f}") -> None:
    bars = ax.bar(labels, values, color="tab:blue")
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)


def _ablation(studies, methods, title):
    rows = studies["ablation"]
    labels = list(rows)
    fig, (speed, aal) = plt.subplots(1, 2, figsize=(10, 3.6))
    _bars(speed, labels, [methods[rows[n]]["tokens_per_s"] for n in labels], "tokens/s")
    _bars(aal, labels, [methods[rows[n]]["aal"] or 0.0 for n in labels], "AAL (tokens per forward)", "{:.2f}")
    fig.suptitle(f"Pool ablation (Table 3), user task: {title}")
    return fig


def _verification(studies, methods, title):
    rows = studies["verification"]
    labels = list(rows)
    fig, (length, speed) = plt.subplots(1, 2, figsize=(9, 3.6))
    _bars(length, labels, [methods[rows[n]]["mean_new_tokens"] for n in labels], "mean generated tokens", "{:.0f}")
    _bars(speed, labels, [methods[rows[n]]["tokens_per_s"] for n in labels], "tokens/s")
    fig.suptitle(f"Verification variants on CRP (Figure 6): {title}")
    return fig


def _speed_and(x, xlabel, speeds, other, other_label, color, title):
    """tokens/s (left axis) and one more series (right axis) against ``x``."""
    fig, speed = plt.subplots(figsize=(6, 3.6))
    speed.plot(x, speeds, "o-", color="tab:blue")
    speed.set_xlabel(xlabel)
    speed.set_ylabel("tokens/s", color="tab:blue")
    twin = speed.twinx()
    twin.plot(x, other, "s--", color=color)
    twin.set_ylabel(other_label, color=color)
    speed.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    fig.suptitle(title)
    return fig, speed


def _pool_size(studies, methods, title):
    sweep = studies["pool_size"]
    fig, _ = _speed_and(
        [row["texts"] for row in sweep],
        "texts in the global pool",
        [methods[r["method"]]["tokens_per_s"] for r in sweep],
        [100 * (methods[r["method"]]["retrieval_share"] or 0.0) for r in sweep],
        "retrieval time share (%)",
        "tab:red",
        f"Pool size (Figure 2), resd: {title}",
    )
    return fig


def _draft_budget(studies, methods, title):
    sweep = studies["draft_budget"]
    fig, speed = _speed_and(
        [row["K"] for row in sweep],
        "K (draft tree tokens per step)",
        [methods[r["method"]]["tokens_per_s"] for r in sweep],
        [methods[r["method"]]["aal"] or 0.0 for r in sweep],
        "AAL",
        "tab:green",
        f"Draft budget, LASER: {title}",
    )
    speed.set_xscale("log", base=2)
    return fig
