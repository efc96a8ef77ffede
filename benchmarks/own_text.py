"""`laser bench own-text`: what one request's own-text index costs inside vLLM's engine loop (prompt lookup and
the earlier-text drafter build it when the request is admitted, and look it up every step).

For each text (random tokens, one token repeated, a three-token cycle) of ``length`` tokens asked ``n_max`` deep,
side by side in one process: the index as built (n-grams up to :data:`laser.own_text.INDEXED`, longer keys
checked against the latest :data:`laser.own_text.SCAN` occurrences) and the same code with both caps lifted
(every n-gram up to ``n_max`` indexed and every occurrence checked: the index before the caps). Figures: build
seconds, traced memory (MiB), and a step's lookup (one new token, the match length and the prompt-lookup draft),
median of ``steps`` steps, in ms. Single-threaded Python; no model.
"""

from __future__ import annotations

import random
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from laser import own_text
from laser.own_text import OwnText

TEXTS = ("random", "repeated", "cycle")


def _text(kind: str, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    if kind == "random":
        return [rng.randrange(49_152) for _ in range(length)]
    if kind == "repeated":
        return [7] * length
    return [i % 3 for i in range(length)]


@contextmanager
def _caps(lifted: bool) -> Iterator[None]:
    saved = own_text.INDEXED, own_text.SCAN
    if lifted:
        own_text.INDEXED, own_text.SCAN = 10**9, 10**9
    try:
        yield
    finally:
        own_text.INDEXED, own_text.SCAN = saved


def measure(kind: str, length: int, n_max: int, lifted: bool, steps: int, seed: int) -> dict[str, Any]:
    tokens = _text(kind, length, seed)
    with _caps(lifted):
        tracemalloc.start()
        t0 = time.perf_counter()
        index = OwnText(max(2, n_max + 1), tokens, longest=n_max)
        build_s = time.perf_counter() - t0
        memory = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            index.extend([tokens[i % len(tokens)]])
            index.match_length(n_max)
            index.latest_follow(n_max, 8)
            times.append(time.perf_counter() - t0)
    return {
        "text": kind,
        "length": length,
        "n_max": n_max,
        "index": "before (uncapped)" if lifted else "capped",
        "keys": len(index._ends),
        "build_s": build_s,
        "memory_mib": memory,
        "step_ms": 1000 * statistics.median(times),
    }


def run_own_text_bench(json_out: Path, length: int = 6144, n_max: int = 32, steps: int = 50, seed: int = 0) -> None:
    from rich.table import Table

    from benchmarks.report import machine_info, save_report, wide_console

    rows = [measure(kind, length, n_max, lifted, steps, seed) for kind in TEXTS for lifted in (True, False)]
    table = Table(title=f"own-text index of a {length}-token text, n_max {n_max}")
    for col in ("text", "index", "keys", "build_s", "memory_mib", "step_ms"):
        table.add_column(col, justify="left" if col in ("text", "index") else "right")
    for r in rows:
        table.add_row(
            r["text"],
            r["index"],
            str(r["keys"]),
            f"{r['build_s']:.3f}",
            f"{r['memory_mib']:.1f}",
            f"{r['step_ms']:.3f}",
        )
    wide_console().print(table)
    save_report({"rows": rows, "machine": machine_info(), "steps": steps, "seed": seed}, json_out)
    _plot(rows, json_out.with_suffix(".png"))


def _plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "build_s", "build (s)"), (axes[1], "step_ms", "step lookup (ms)")):
        for offset, index in ((-0.2, "before (uncapped)"), (0.2, "capped")):
            values = [r[key] for r in rows if r["index"] == index]
            ax.bar([i + offset for i in range(len(TEXTS))], values, 0.4, label=index)
        ax.set_xticks(range(len(TEXTS)), TEXTS)
        ax.set_ylabel(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
