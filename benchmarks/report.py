"""Measuring and reporting decoding benchmarks: timed runs, summary metrics, tables, machine info.

Metric definitions (LASER section 4.1.3; ``shared/notes`` section 6), over all prompts of a method:

- ``tokens_per_s``: generated tokens / wall seconds of the requests (prefill included);
- ``speedup_vs_generate``: tokens_per_s / tokens_per_s of the reference (transformers greedy ``generate``);
- ``aal``: tokens per target forward, i.e. (accepted drafts + 1) averaged over decoding steps (prefill
  excluded); ``None`` for methods whose steps we cannot see (transformers);
- ``art_ms_per_step``: retrieval (drafting) milliseconds per decoding step; ``art_ms_per_request`` per prompt;
- ``length_ratio_vs_greedy``: generated tokens / the reference's generated tokens;
- ``identical_to_greedy``: every prompt's tokens equal the reference's.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from rich.console import Console
from rich.table import Table

import laser
from laser import DecodeStats
from pipelines.knowledge.prompts import PROMPT_VERSION
from pipelines.quality import summarise_quality
from pipelines.store.location import atomic_write_local

STAGES = ("prefill_s", "retrieval_s", "tree_s", "forward_s", "verify_s", "cache_s")


@dataclass
class Run:
    """One request of one method: generated ids, wall seconds, and the decoder's counters when it has them."""

    tokens: list[int]
    seconds: float
    stats: DecodeStats | None = None
    text: str | None = None  # the decoded text, for the quality figures
    finish_reason: str | None = None  # "eos" | "length"


def repeat_median(fn: Callable[[], Run], repeats: int) -> Run:
    """Run ``fn`` ``repeats`` times; the run with the median wall time (outputs are deterministic)."""
    runs = sorted((fn() for _ in range(max(1, repeats))), key=lambda r: r.seconds)
    return runs[(len(runs) - 1) // 2]


def hf_generate(lm: laser.LoadedModel, ids: list[int], max_new_tokens: int, **generate_kwargs: Any) -> Run:
    """transformers ``generate`` (greedy unless kwargs say otherwise) on one prompt, timed."""
    inputs = torch.tensor([ids], device=lm.model.device)
    t0 = time.perf_counter()
    out = generate_ids(
        lm,
        inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=max_new_tokens,
        **{"do_sample": False, **generate_kwargs},
    )
    seconds = time.perf_counter() - t0
    tokens = _until_eos(out[0, len(ids) :].tolist(), lm.eos_ids)
    finish = "eos" if tokens and tokens[-1] in lm.eos_ids else "length"
    text = str(lm.tokenizer.decode(tokens, skip_special_tokens=True)) if lm.tokenizer is not None else None
    return Run(tokens, seconds, text=text, finish_reason=finish)


def generate_ids(lm: laser.LoadedModel, inputs: torch.Tensor, **generate_kwargs: Any) -> torch.Tensor:
    """transformers ``generate`` on a batch of prompts: the token ids ``[B, prompt + new]``."""
    model = lm.model
    if not isinstance(model, transformers.GenerationMixin):
        raise TypeError(f"{lm.name}: {type(model).__name__} has no generate (not a transformers causal LM)")
    # transformers annotates generate's self as a Protocol its own models do not satisfy for mypy
    out = model.generate(inputs, **generate_kwargs)  # type: ignore[misc]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{lm.name}: generate returned a {type(out).__name__}, not token ids")
    return out


def _until_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """Cut padding after the first end-of-sequence token (kept), as our decoders report."""
    for i, tok in enumerate(tokens):
        if tok in eos_ids:
            return tokens[: i + 1]
    return tokens


def timed_decode(decoder: laser.Decoder, ids: list[int], max_new_tokens: int, pool: Any = None) -> Run:
    """One of our decoders on one prompt, timed (wall clock around the call)."""
    t0 = time.perf_counter()
    out = decoder.generate(ids, max_new_tokens, pool=pool)
    seconds = time.perf_counter() - t0
    text = out.text if getattr(decoder.lm, "tokenizer", None) is not None else None  # no tokenizer: no text
    return Run(out.token_ids, seconds, out.stats, text=text, finish_reason=out.stats.finish_reason)


def tokens_per_s(runs: Sequence[Run]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(len(r.tokens) for r in runs) / seconds if seconds > 0 else 0.0


def method_metrics(runs: Sequence[Run], reference: Sequence[Run]) -> dict[str, Any]:
    """Summary metrics of one method against the reference runs on the same prompts (module docstring)."""
    if len(runs) != len(reference) or not runs:
        raise ValueError(f"{len(runs)} runs against {len(reference)} reference runs")
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    stats = [r.stats for r in runs if r.stats is not None]
    steps = sum(st.target_forwards for st in stats)
    accepted = sum(sum(st.accepted_per_step) for st in stats)
    totals = {f: sum(getattr(st, f) for st in stats) for f in STAGES}
    decode_s = sum(st.decode_s for st in stats)
    overhead = totals["retrieval_s"] + totals["tree_s"] + totals["verify_s"] + totals["cache_s"]
    base_tps = tokens_per_s(reference)
    tps = tokens / seconds if seconds > 0 else 0.0
    return {
        "tokens_per_s": tps,
        "speedup_vs_generate": tps / base_tps if base_tps else 0.0,
        "aal": (accepted + steps) / steps if steps else None,
        "art_ms_per_step": 1000 * totals["retrieval_s"] / steps if steps else None,
        "art_ms_per_request": 1000 * totals["retrieval_s"] / len(runs) if stats else None,
        "retrieval_share": totals["retrieval_s"] / seconds if stats and seconds > 0 else None,
        "overhead_share_of_step": overhead / decode_s if decode_s > 0 else None,
        "mean_new_tokens": tokens / len(runs),
        "length_ratio_vs_greedy": tokens / max(1, sum(len(r.tokens) for r in reference)),
        "identical_to_greedy": all(r.tokens == ref.tokens for r, ref in zip(runs, reference)),
        "identical_prompts": sum(r.tokens == ref.tokens for r, ref in zip(runs, reference)),
        "prompts": len(runs),
        "seconds": seconds,
        "target_forwards": steps,
        "time_breakdown_s": totals if stats else None,
        "time_breakdown_ms_per_step": _per_step_ms(totals, decode_s, steps, len(runs)) if steps else None,
        "quality": _quality(runs),
    }


def _quality(runs: Sequence[Run]) -> dict[str, Any] | None:
    """EOS share, mean repeated-4-gram share and degenerate count (pipelines/quality/) when texts are known."""
    texts = [r.text for r in runs if r.text is not None]
    reasons = [r.finish_reason for r in runs if r.finish_reason is not None]
    if len(texts) < len(runs) or len(reasons) < len(runs):
        return None
    return summarise_quality(texts, reasons).as_dict()


def _per_step_ms(totals: dict[str, float], decode_s: float, steps: int, requests: int) -> dict[str, float]:
    """Milliseconds per decoding step of each stage; prefill per request; ``other`` = the step's rest."""
    per_step = {f.removesuffix("_s"): 1000 * totals[f] / steps for f in STAGES if f != "prefill_s"}
    per_step["other"] = 1000 * decode_s / steps - sum(per_step.values())
    return {"prefill_per_request": 1000 * totals["prefill_s"] / requests, **per_step}


def summarise(rows: dict[str, list[Run]], reference: str) -> dict[str, dict[str, Any]]:
    """Metrics of every method in ``rows`` against the method named ``reference``."""
    return {name: method_metrics(runs, rows[reference]) for name, runs in rows.items()}


def save_report(report: dict[str, Any], json_out: Path, markdown: str | None = None) -> None:
    """Write a benchmark's JSON (atomically, its folder made) and, given one, its Markdown table beside it."""
    json_out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_local(json_out, lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1, default=str) + "\n"))
    if markdown is not None:
        json_out.with_suffix(".md").write_text(markdown)


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken (load average included: the machine may be shared)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": load,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("laser-knowledge")
    except PackageNotFoundError:
        ours = "unknown"
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "laser": ours,
        "prompt_version": PROMPT_VERSION,
    }


def wide_console() -> Console:
    """A console that does not squeeze the tables into 80 columns when the output is a file."""
    return Console() if sys.stdout.isatty() else Console(width=170)


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_methods(title: str, methods: dict[str, dict[str, Any]], console: Console | None = None) -> None:
    """The speed table: tokens/s, speedup, AAL, ART, overhead, length and identity per method."""
    table = Table(title=title)
    for col in (
        "method",
        "tokens/s",
        "speedup",
        "AAL",
        "ART ms/step",
        "overhead",
        "new tokens",
        "len ratio",
        "= greedy",
    ):
        table.add_column(col, justify="right")
    for name, m in methods.items():
        share = None if m["overhead_share_of_step"] is None else 100 * m["overhead_share_of_step"]
        table.add_row(
            name,
            f"{m['tokens_per_s']:.1f}",
            f"{m['speedup_vs_generate']:.2f}x",
            _fmt(m["aal"], ".2f"),
            _fmt(m["art_ms_per_step"], ".3f"),
            _fmt(share, ".1f", "%"),
            f"{m['mean_new_tokens']:.0f}",
            f"{m['length_ratio_vs_greedy']:.2f}",
            "yes" if m["identical_to_greedy"] else f"no ({m['identical_prompts']}/{m['prompts']})",
        )
    (console or wide_console()).print(table)


def print_breakdown(title: str, methods: dict[str, dict[str, Any]], console: Console | None = None) -> None:
    """Per-step time breakdown (ms) of every method that reports its stages."""
    rows = {n: m["time_breakdown_ms_per_step"] for n, m in methods.items() if m.get("time_breakdown_ms_per_step")}
    if not rows:
        return
    cols = list(next(iter(rows.values())))
    table = Table(title=title)
    table.add_column("method", justify="right")
    for col in cols:
        table.add_column(col.replace("_", " "), justify="right")
    for name, b in rows.items():
        table.add_row(name, *(f"{b[c]:.2f}" for c in cols))
    (console or wide_console()).print(table)


def markdown_methods(methods: dict[str, dict[str, Any]]) -> str:
    """The speed table as Markdown (for README results)."""
    lines = [
        "| method | tokens/s | speedup | AAL | ART ms/step | new tokens | len ratio | = greedy |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, m in methods.items():
        same = "yes" if m["identical_to_greedy"] else f"no ({m['identical_prompts']}/{m['prompts']})"
        lines.append(
            f"| {name} | {m['tokens_per_s']:.1f} | {m['speedup_vs_generate']:.2f}x | {_fmt(m['aal'], '.2f')} | "
            f"{_fmt(m['art_ms_per_step'], '.3f')} | {m['mean_new_tokens']:.0f} | "
            f"{m['length_ratio_vs_greedy']:.2f} | {same} |"
        )
    return "\n".join(lines)


def markdown_breakdown(methods: dict[str, dict[str, Any]]) -> str:
    """The per-step time breakdown (ms) as Markdown."""
    rows = {n: m["time_breakdown_ms_per_step"] for n, m in methods.items() if m.get("time_breakdown_ms_per_step")}
    if not rows:
        return ""
    cols = list(next(iter(rows.values())))
    lines = ["| method | " + " | ".join(c.replace("_", " ") for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    lines += [f"| {n} | " + " | ".join(f"{b[c]:.2f}" for c in cols) + " |" for n, b in rows.items()]
    return "\n".join(lines)
