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
    for name, draw in (("ablation", _ablation), ("verification", _verification), ("pool-size", _pool_size),
                       ("draft-budget", _draft_budget)):
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


def _pool_size(studies, methods, title):
    sweep = studies["pool_size"]
    texts = [row["texts"] for row in sweep]
    fig, speed = plt.subplots(figsize=(6, 3.6))
    speed.plot(texts, [methods[r["method"]]["tokens_per_s"] for r in sweep], "o-", color="tab:blue")
    speed.set_xlabel("texts in the global pool")
    speed.set_ylabel("tokens/s", color="tab:blue")
    share = speed.twinx()
    share.plot(texts, [100 * (methods[r["method"]]["retrieval_share"] or 0.0) for r in sweep], "s--", color="tab:red")
    share.set_ylabel("retrieval time share (%)", color="tab:red")
    speed.set_ylim(bottom=0)
    share.set_ylim(bottom=0)
    fig.suptitle(f"Pool size (Figure 2), resd: {title}")
    return fig


def _draft_budget(studies, methods, title):
    sweep = studies["draft_budget"]
    ks = [row["K"] for row in sweep]
    fig, speed = plt.subplots(figsize=(6, 3.6))
    speed.plot(ks, [methods[r["method"]]["tokens_per_s"] for r in sweep], "o-", color="tab:blue")
    speed.set_xscale("log", base=2)
    speed.set_xlabel("K (draft tree tokens per step)")
    speed.set_ylabel("tokens/s", color="tab:blue")
    aal = speed.twinx()
    aal.plot(ks, [methods[r["method"]]["aal"] or 0.0 for r in sweep], "s--", color="tab:green")
    aal.set_ylabel("AAL", color="tab:green")
    speed.set_ylim(bottom=0)
    aal.set_ylim(bottom=0)
    fig.suptitle(f"Draft budget, LASER: {title}")
    return fig
