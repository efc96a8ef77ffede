"""`laser bench throughput --engine vllm`: vLLM with and without LASER as its drafter, beside our engine.

Same prompts and pools as `laser bench throughput` (new user histories; pools of earlier profiles routed
by collaborative group). At each concurrency c (default 1, 4, 16, 64, 128) every selected method
(``--methods``) decodes the first ``max(c, min_prompts)`` prompts with at most c in flight, ``repeats``
times, interleaved (repeat 1 of every method, then repeat 2, ...):

- ``transformers generate`` (static batches of c), ``laser relaxed (auto)`` (our engine, c slots) and its
  chain-only twin, in this process;
- ``vllm`` (no speculation), ``vllm ngram`` (prompt lookup, 8 tokens, n 2-4), ``vllm suffix`` (Arctic
  Inference's suffix decoding; only where ``arctic_inference`` imports), ``laser-vllm greedy`` and
  ``laser-vllm relaxed`` (LASER as vLLM's drafter, routed pools, draft length ``auto`` from the vLLM
  step-cost model): each in a level process of its own (:mod:`benchmarks.vllm_level`: which
  engine state is reused between repeats, and why that is safe), ``max_num_seqs`` = c, the KV cache
  sized for every request in flight.

JSON: ``levels[c][method]``: ``tokens_per_s`` (the median of the repeats, prefill included, wall),
``tokens_per_s_runs``, ``tokens_per_s_min``, ``tokens_per_s_max``, ``decode_tokens_per_s`` (wall minus
a prefill estimate), ``aal``, ``speedup_vs_vllm`` (median over median), ``vs_vllm`` (tie / faster /
slower: a tie needs overlapping spreads and a ratio >= 0.98), ``identical_to_vllm`` (prompts whose
tokens equal vLLM greedy's), ``proposer_ms_per_step`` and ``mean_draft_len`` (LASER rows);
``engine_reuse`` per level, ``targets`` (the engine issue's), ``cost_model`` (the vLLM step cost), load
averages before and after. Markdown and a PNG (tokens/s against concurrency with the repeats' spread; the
measured step-cost curve) beside the JSON.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import laser
from laser.defaults import RELAXED_K, RELAXED_P
from laser.drafting import Drafter
from laser.tree import DraftTree
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset
from pipelines.quality import summarise_quality
from benchmarks.report import machine_info, versions, wide_console, save_report
from benchmarks.suite import build_task_pools, pool_for, user_fixture
from benchmarks.throughput import (
    GENERATE,
    ThroughputMethod,
    ThroughputSettings,
    _as_suite_method,
    _engine_level,
    _generate_level,
    _warm_up,
    select_rows,
)

log = logging.getLogger(__name__)

VLLM = "vllm"
HF_RELAXED = "laser relaxed (auto)"
HF_CHAINS = "laser relaxed (auto), chains"  # our engine drafting only what vLLM can verify: a tree's worth
VLLM_METHODS: dict[str, dict[str, Any]] = {
    "vllm": {"speculation": None},
    "vllm ngram": {"speculation": "ngram", "max_draft": 8},
    "vllm suffix": {"speculation": "suffix", "max_draft": 16},
    "laser-vllm greedy": {"speculation": "laser", "draft_len": "auto", "verification": "greedy", "pool": "crp"},
    "laser-vllm relaxed": {
        "speculation": "laser",
        "draft_len": "auto",
        "verification": "relaxed",
        "k": RELAXED_K,
        "p": RELAXED_P,
        "pool": "crp",
    },
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
    concurrency: tuple[int, ...] = (1, 4, 16, 64, 128)
    min_prompts: int = 16
    max_model_len: int = 1024
    kv_cache_gib: float = 0  # per vLLM engine; 0: sized per level to hold every request in flight at once
    repeats: int = 3  # interleaved runs of every method at each concurrency (median and spread reported)
    methods: tuple[str, ...] = ()  # the rows to run (ALL_METHODS names); empty: all
    warm_tokens: int = 8  # new tokens per prompt of each engine's untimed warm-up pass over the level's prompts
    reuse_engines: str = "auto"  # "auto": one engine per (method, level) for all repeats, for as many methods
    #                              as fit in memory together (suffix never); "never": a fresh engine per repeat


ALL_METHODS = (GENERATE, HF_RELAXED, HF_CHAINS, *VLLM_METHODS)
HF_METHODS = (GENERATE, HF_RELAXED, HF_CHAINS)
MAX_DRAFT = max(m.get("max_draft", 8) for m in VLLM_METHODS.values())


def select_methods(names: tuple[str, ...] | list[str] | None) -> list[str]:
    """The vLLM bench's rows to run, in the report's order."""
    return select_rows(names, list(ALL_METHODS))


def run_throughput_vllm(
    json_out: Path, s: VllmThroughputSettings, dataset: DatasetConfig | None = None, cache_root: Path | None = None
) -> dict[str, Any]:
    """Measure, print the table, write JSON, Markdown and the PNG; return the report."""
    from laser.cost import ForwardCost
    from benchmarks.vllm_level import ENGINE_BASE_GIB, LevelProcess, available_gib, in_fresh_process, kv_cache_gib

    if s.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {s.repeats}")
    if s.reuse_engines not in ("auto", "never"):
        raise ValueError(f"reuse_engines must be 'auto' or 'never', got {s.reuse_engines!r}")
    wanted = select_methods(s.methods)
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
    longest = max(map(len, prompts)) + s.max_new_tokens + MAX_DRAFT
    if longest > s.max_model_len:
        raise ValueError(
            f"max_model_len {s.max_model_len} is below the longest request ({longest} tokens: prompt, "
            f"{s.max_new_tokens} new and {MAX_DRAFT} draft tokens); raise it or lower max_prompt_tokens"
        )
    model_dir = laser.models.model_dir(s.model)
    why_no_suffix = suffix_available()
    absent = {} if why_no_suffix is None or "vllm suffix" not in wanted else {"vllm suffix": why_no_suffix}
    methods = [m for m in wanted if m not in absent]
    vllm_methods = [m for m in methods if m in VLLM_METHODS]
    relaxed = ThroughputMethod(HF_RELAXED, "laser", {"verification": "relaxed"}, "crp")
    hf_decoder = None
    if HF_RELAXED in methods or HF_CHAINS in methods:
        hf_decoder = laser.get_decoder("laser", lm, verification="relaxed")
    _warm_up(lm, {HF_RELAXED: hf_decoder} if hf_decoder is not None else {}, prompts[0])
    base = {
        "model": model_dir,
        "threads": s.threads,
        "max_model_len": s.max_model_len,
        "max_new_tokens": s.max_new_tokens,
        "warm_tokens": s.warm_tokens,
        "vocab": len(lm.tokenizer) if lm.tokenizer is not None else 32000,
    }
    cost_dict, cost = None, None
    if any(VLLM_METHODS[m].get("draft_len") == "auto" for m in vllm_methods):
        log.info("the vLLM step-cost model (measured unless cached for this machine)")
        top = min(max(s.concurrency), 64)
        cost_dict = in_fresh_process(
            {
                **base,
                "task": "measure_cost",
                "concurrency": top,
                "remeasure": s.remeasure_cost,
                "kv_cache_gib": s.kv_cache_gib or kv_cache_gib(model_dir, [256 + 64] * top),
            }
        )
        cost = ForwardCost(**cost_dict)
    report: dict[str, Any] = {
        "settings": asdict(s),
        "engine": "vllm",
        "machine": machine_info(),
        "versions": versions(),
        "dataset": dataset.model_dump(),
        "cost_model": cost_dict,
        "levels": {},
        "methods": methods,
        "absent": absent,
        "engine_reuse": {},
    }
    report["machine"]["load_average_before"] = load_before
    try:
        import vllm

        report["versions"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    for c in s.concurrency:
        n = min(max(c, s.min_prompts), len(prompts))
        ps = [pool_for(_as_suite_method(relaxed), task, groups.get(e), pools) for e in order[:n]]
        lens = sorted((len(p) + s.max_new_tokens + MAX_DRAFT for p in prompts[:n]), reverse=True)[:c]
        kv = s.kv_cache_gib or kv_cache_gib(model_dir, lens)
        specs: dict[str, dict[str, Any]] = {}
        for name in vllm_methods:
            m = VLLM_METHODS[name]
            keys: list[str | None] = [None] * n
            used: dict[str, Any] = {}
            if m.get("pool"):
                for i, e in enumerate(order[:n]):
                    if ps[i] is not None:
                        keys[i] = key = f"crp/{groups.get(e)}"
                        used[key] = ps[i]
            specs[name] = {
                **base,
                "method": m,
                "concurrency": c,
                "prompts": prompts[:n],
                "pool_keys": keys,
                "pools": used,
                "kv_cache_gib": kv,
                "cost": cost if m.get("draft_len") == "auto" else None,
            }
        engine_gib = kv + ENGINE_BASE_GIB
        keep = (
            engines_to_keep(vllm_methods, engine_gib, available_gib() - 1.0)
            if s.reuse_engines == "auto" and s.repeats > 1
            else []
        )
        report["engine_reuse"][str(c)] = {
            "kv_cache_gib": kv,
            "one_engine_for_all_repeats": keep,
            "fresh_engine_per_repeat": [m for m in vllm_methods if m not in keep],
            "estimated_gib": engines_gib(len(keep), len(vllm_methods), engine_gib),
        }
        prefill_by = vllm_methods[0] if vllm_methods else None  # its first repeat times the level's prefill
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        live: dict[str, Any] = {}
        try:
            for r in range(s.repeats):  # interleaved: every method once, then the next repeat
                for name in methods:
                    log.info("c=%d repeat %d/%d: %s", c, r + 1, s.repeats, name)
                    if name == GENERATE:
                        lv = _generate_level(lm, prompts[:n], c, s.max_new_tokens)
                        runs[name].append(_hf_run(lv))
                    elif name in (HF_RELAXED, HF_CHAINS):
                        if hf_decoder is None:
                            raise RuntimeError(f"{name}: no HF decoder made for it")  # made above when chosen
                        src = ps if name == HF_RELAXED else [ChainSource(p) if p is not None else None for p in ps]
                        lv = _engine_level(hf_decoder, prompts[:n], src, c, s.max_new_tokens)
                        runs[name].append(_hf_run(lv, aal=_aal(lv)))
                    else:
                        lp = live.pop(name, None)
                        fresh = lp is None
                        if fresh:
                            lp = LevelProcess(specs[name])
                        res = lp.run(measure_prefill=(r == 0 and name == prefill_by))
                        res["fresh_engine"] = fresh
                        runs[name].append(res)
                        if name in keep and r + 1 < s.repeats:
                            live[name] = lp
                        else:
                            lp.close()
                    last = runs[name][-1]
                    extra = "".join(
                        f", {k} {last[k]:.1f} s"
                        for k in ("start_s", "warm_s")
                        if last.get("fresh_engine") and last.get(k) is not None
                    )
                    log.info(
                        "c=%d repeat %d/%d: %s: %.1f tok/s (%d tokens in %.1f s%s)",
                        c,
                        r + 1,
                        s.repeats,
                        name,
                        last["tokens"] / last["wall_s"],
                        last["tokens"],
                        last["wall_s"],
                        extra,
                    )
                # the repeats so far, should the bench stop before the level ends
                report["levels"][str(c)] = aggregate_level(
                    {k: v for k, v in runs.items() if v}, prefill_by, texts_quality(lm.tokenizer, s.max_new_tokens)
                )
                _write(json_out, {**report, "complete": False})
        finally:
            for lp in live.values():
                lp.close()
        level = report["levels"][str(c)]
        print(
            f"c={c}: "
            + ", ".join(
                f"{k} {v['tokens_per_s']:.1f} [{v['tokens_per_s_min']:.1f}-{v['tokens_per_s_max']:.1f}]"
                for k, v in level.items()
            ),
            flush=True,
        )
    report["complete"] = True
    report["duration_s"] = time.perf_counter() - started
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    return finish_vllm_report(report, json_out)


def engines_gib(kept: int, methods: int, engine_gib: float) -> float:
    """Memory of ``kept`` live engines, plus one fresh engine beside them when a method is left over."""
    return (kept + (kept < methods)) * engine_gib


def engines_to_keep(methods: list[str], engine_gib: float, budget_gib: float) -> list[str]:
    """The methods whose engine lives for all repeats of a level: as many as fit in ``budget_gib`` with
    room for one fresh engine beside them when some method is left over, in the order given (the rest get a
    fresh engine per repeat). Suffix decoding never keeps one (its global tree would replay the previous
    repeat's answers)."""
    candidates = [m for m in methods if VLLM_METHODS[m]["speculation"] != "suffix"]
    for n in range(len(candidates), 0, -1):
        if engines_gib(n, len(methods), engine_gib) <= budget_gib:
            return candidates[:n]
    return []


def finish_vllm_report(report: dict[str, Any], json_out: Path) -> dict[str, Any]:
    """Check the targets on the levels measured, print the table and write the JSON, Markdown and PNG. Also
    renders the JSON of a run stopped before its last level (``complete`` false: its levels so far)."""
    report["targets"] = check_vllm_targets(report)
    print_vllm_throughput(report)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_vllm_throughput(report, json_out.with_suffix(".png")))
    save_report(report, json_out, markdown_vllm_throughput(report))
    return report


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)


def _hf_run(level: Any, **extra: Any) -> dict[str, Any]:
    return {
        "tokens": level.tokens,
        "wall_s": level.wall_s,
        "prefill_s": level.prefill_s,
        "outputs": level.outputs,
        **extra,
    }


def _aal(level: Any) -> float | None:
    """Tokens per target forward of one of our engine's levels."""
    rows = sum(st.rows for st in level.steps)
    return sum(st.rows + st.accepted for st in level.steps) / rows if rows else None


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def texts_quality(tokenizer: Any, max_new_tokens: int) -> Callable[[list[list[int]]], dict[str, Any]]:
    """Quality of one run's outputs (token ids; a text as long as ``max_new_tokens`` counts as cut at the
    limit): how many loop (degenerate, pipelines/quality/) and how many ended by EOS."""

    def quality(outputs: list[list[int]]) -> dict[str, Any]:
        texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
        reasons = ["length" if len(o) >= max_new_tokens else "eos" for o in outputs]
        q = summarise_quality(texts, reasons).as_dict()
        return {k: q[k] for k in ("n", "degenerate", "finished_eos", "mean_repeat_4gram")}

    return quality


def aggregate_level(
    runs: dict[str, list[dict[str, Any]]],
    prefill_by: str | None = None,
    quality: Callable[[list[list[int]]], dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each method's cell from its repeats: median tokens/s with its spread (min, max) and every run, the
    median of the other figures, and the comparison with ``vllm`` (median over median; a tie when the
    spreads overlap and the ratio is at least ``TIE_RATIO``). vLLM rows without a prefill estimate of their
    own take ``prefill_by``'s (the same prompts through the same model). ``quality``: the texts' quality
    of a run's outputs, kept for the first repeat."""
    shared_prefill = None
    if prefill_by in runs:
        shared_prefill = _median([r.get("prefill_s") for r in runs[prefill_by]])
    level: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        if not rs:
            continue
        tps = [r["tokens"] / r["wall_s"] for r in rs]
        prefill = _median([r.get("prefill_s") for r in rs])
        if prefill is None:
            prefill = shared_prefill
        cell: dict[str, Any] = {
            "tokens": rs[0]["tokens"],
            "tokens_runs": [r["tokens"] for r in rs],
            "wall_s": _median([r["wall_s"] for r in rs]),
            "wall_s_runs": [r["wall_s"] for r in rs],
            "prefill_s": prefill,
            "repeats": len(rs),
            "tokens_per_s": float(statistics.median(tps)),
            "tokens_per_s_runs": tps,
            "tokens_per_s_min": min(tps),
            "tokens_per_s_max": max(tps),
            "decode_tokens_per_s": (
                _median([r["tokens"] / max(r["wall_s"] - prefill, 1e-9) for r in rs]) if prefill is not None else None
            ),
            "prompts": len(rs[0]["outputs"]),
            "identical_across_repeats": all(r["outputs"] == rs[0]["outputs"] for r in rs),
            "_outputs": rs[0]["outputs"],
        }
        if quality is not None:
            cell["texts"] = quality(rs[0]["outputs"])
        for key in ("aal", "proposer_ms_per_step", "mean_draft_len", "mean_draft_tokens_per_step", "target_forwards"):
            v = _median([r.get(key) for r in rs])
            if v is not None:
                cell[key] = v
        if "start_s" in rs[0]:
            fresh = [r for r in rs if r.get("fresh_engine", True)]
            cell["engines"] = len(fresh)
            cell["start_s_runs"] = [r["start_s"] for r in fresh]
            cell["warm_s_runs"] = [r["warm_s"] for r in fresh]
        level[name] = cell
    ref = level.get(VLLM)
    gen = level.get(GENERATE)
    for name, lv in level.items():
        if ref is not None:
            lv["speedup_vs_vllm"] = lv["tokens_per_s"] / ref["tokens_per_s"]
            lv["vs_vllm"] = None if name == VLLM else verdict(lv, ref)
            lv["identical_to_vllm"] = sum(a == b for a, b in zip(lv["_outputs"], ref["_outputs"]))
        if gen is not None:
            lv["speedup_vs_generate"] = lv["tokens_per_s"] / gen["tokens_per_s"]
    for lv in level.values():
        lv.pop("_outputs")
    return level


TIE_RATIO = 0.98


def spreads_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    lo_a, hi_a = a.get("tokens_per_s_min", a["tokens_per_s"]), a.get("tokens_per_s_max", a["tokens_per_s"])
    lo_b, hi_b = b.get("tokens_per_s_min", b["tokens_per_s"]), b.get("tokens_per_s_max", b["tokens_per_s"])
    return lo_a <= hi_b and lo_b <= hi_a


def verdict(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``a`` against ``b``: "tie" when their spreads overlap and a's median is at least 0.98x b's; else
    "faster" or "slower" by the medians."""
    ratio = a["tokens_per_s"] / b["tokens_per_s"]
    if spreads_overlap(a, b) and ratio >= TIE_RATIO:
        return "tie"
    return "faster" if ratio > 1 else "slower"


def check_vllm_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The engine issue's targets, each with its measured value (medians). A "never below" or "ahead of"
    target (minimum 1.0) is also met where every cell under 1.0 is a tie (spreads overlap, ratio >= 0.98);
    those concurrencies are listed under ``ties``."""
    levels = report["levels"]
    rel, grd = "laser-vllm relaxed", "laser-vllm greedy"
    out: list[dict[str, Any]] = []

    def ratio(a: str, b: str, cs: list[str]) -> tuple[float | None, list[str], bool]:
        cells = [(c, levels[c][a], levels[c][b]) for c in cs if a in levels[c] and b in levels[c]]
        if not cells:
            return None, [], False
        vals = [x["tokens_per_s"] / y["tokens_per_s"] for _, x, y in cells]
        below = [(c, x, y) for (c, x, y), v in zip(cells, vals) if v < 1.0]
        ties = [c for c, x, y in below if verdict(x, y) == "tie"]
        return min(vals), ties, len(ties) == len(below)

    cs = list(levels)
    for target, (value, ties, tied), minimum in (
        ("laser-vllm relaxed never below vllm (worst concurrency)", ratio(rel, VLLM, cs), 1.0),
        (
            "laser-vllm relaxed vs vllm at concurrency 1 and 4 (worse of the two)",
            ratio(rel, VLLM, [c for c in cs if c in ("1", "4")]),
            1.3,
        ),
        ("laser-vllm relaxed ahead of vllm ngram (worst concurrency)", ratio(rel, "vllm ngram", cs), 1.0),
        ("laser-vllm relaxed ahead of vllm suffix (worst concurrency)", ratio(rel, "vllm suffix", cs), 1.0),
    ):
        if value is not None:
            t: dict[str, Any] = {"target": target, "value": value, "minimum": minimum}
            if minimum == 1.0 and ties:
                t["ties"] = [int(c) for c in ties]
                t["met_by_ties"] = tied
            out.append(t)
    ours, theirs = (HF_RELAXED, rel), [n for n in VLLM_METHODS if not n.startswith("laser-vllm")]
    best = [
        max(levels[c][a]["tokens_per_s"] for a in ours if a in levels[c])
        / max(levels[c][b]["tokens_per_s"] for b in theirs if b in levels[c])
        for c in cs
        if any(a in levels[c] for a in ours) and any(b in levels[c] for b in theirs)
    ]
    if best:
        out.append(
            {
                "target": "the better of our two engines ahead of every vLLM row (worst concurrency)",
                "value": min(best),
                "minimum": 1.0,
            }
        )
    ident = [
        levels[c][grd]["identical_to_vllm"] / levels[c][grd]["prompts"]
        for c in cs
        if grd in levels[c] and levels[c][grd].get("identical_to_vllm") is not None
    ]
    if ident:
        out.append(
            {
                "target": "laser-vllm greedy tokens identical to vllm greedy (worst concurrency)",
                "value": min(ident),
                "minimum": 1.0,
            }
        )
    for t in out:
        t["met"] = t["value"] >= t["minimum"] or bool(t.get("met_by_ties"))
    return out


def _names(levels: dict[str, dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for lv in levels.values():
        seen += [n for n in lv if n not in seen]
    return seen


def _tps(m: dict[str, Any]) -> str:
    if "tokens_per_s_min" in m:
        return f"{m['tokens_per_s']:.1f} [{m['tokens_per_s_min']:.1f}-{m['tokens_per_s_max']:.1f}]"
    return f"{m['tokens_per_s']:.1f}"


def _ppm(m: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """A cell's prompts per minute, median [min-max] over its repeats, and its median over ``ref``'s."""

    def rates(cell: dict[str, Any]) -> list[float]:
        return [cell["prompts"] * 60 / w for w in cell["wall_s_runs"]]

    mine = rates(m)
    versus = f" ({statistics.median(mine) / statistics.median(rates(ref)):.2f}x)" if ref else ""
    return f"{statistics.median(mine):.1f} [{min(mine):.1f}-{max(mine):.1f}]{versus}"


def _versus(m: dict[str, Any]) -> str:
    if "speedup_vs_vllm" not in m:
        return ""
    tag = f" {m['vs_vllm']}" if m.get("vs_vllm") else ""
    return f"{m['speedup_vs_vllm']:.2f}x{tag}"


def _drafting(m: dict[str, Any]) -> str:
    parts = []
    if m.get("proposer_ms_per_step") is not None:
        parts.append(f"{m['proposer_ms_per_step']:.1f} ms/step")
    if m.get("mean_draft_len") is not None:
        parts.append(f"draft {m['mean_draft_len']:.2f}/row")
    return ", ".join(parts)


def _target_line(t: dict[str, Any], md: bool) -> str:
    ties = f"; ties at c={','.join(map(str, t['ties']))}" if t.get("ties") else ""
    if md:
        return (
            f"- {'met' if t['met'] else '**missed**'}: {t['target']}: {t['value']:.2f} (needs >= {t['minimum']}{ties})"
        )
    return f"{'met ' if t['met'] else 'MISS'}  {t['target']}: {t['value']:.2f} (needs >= {t['minimum']}{ties})"


def print_vllm_throughput(report: dict[str, Any]) -> None:
    from rich.table import Table

    console = wide_console()
    st = report["settings"]
    table = Table(
        title=f"bench throughput --engine vllm: {st['model']}, {st['threads']} threads, "
        f"{st['max_new_tokens']} new tokens max, {st.get('repeats', 1)} interleaved repeats "
        f"(tok/s with prefill: median [min-max]; x vllm; aal; proposer ms/step, draft tokens/row)"
    )
    table.add_column("method", justify="right")
    for c in report["levels"]:
        table.add_column(f"c={c}", justify="right")
    for name in _names(report["levels"]):
        cells = []
        for lv in report["levels"].values():
            m = lv.get(name)
            if m is None:
                cells.append("-")
                continue
            aal = f" aal {m['aal']:.2f}" if m.get("aal") is not None else ""
            drafting = _drafting(m)
            cells.append(f"{_tps(m)}\n{_versus(m)}{aal}" + (f"\n{drafting}" if drafting else ""))
        table.add_row(name, *cells)
    console.print(table)
    for name, why in report["absent"].items():
        console.print(f"absent: {name}: {why}")
    for t in report["targets"]:
        console.print(_target_line(t, md=False))


def markdown_vllm_throughput(report: dict[str, Any]) -> str:
    levels = report["levels"]
    names = _names(levels)
    m = report["machine"]
    st = report["settings"]
    head = ["| method | " + " | ".join(f"c={c}" for c in levels) + " |", "|---|" + "---:|" * len(levels)]

    def row(name: str, fmt) -> str:
        return f"| {name} | " + " | ".join(fmt(levels[c][name]) if name in levels[c] else "-" for c in levels) + " |"

    lines = [
        f"Load average before {m.get('load_average_before')}, after {m.get('load_average_after')}. "
        f"{st.get('repeats', 1)} interleaved repeats per cell (every method once, then the next repeat).",
        "",
        "Tokens/s with prefill, median [min-max] of the repeats (median x vLLM's median at the same "
        f"concurrency; tie: the spreads overlap and the ratio is >= {TIE_RATIO}):",
        "",
        *head,
    ]
    lines += [row(n, lambda x: f"{_tps(x)} ({_versus(x) or '-'})") for n in names]
    lines += [
        "",
        "Prompts finished per minute, median [min-max] of the repeats (x vLLM's median). Every row "
        "decodes the same prompts; relaxed verification changes the texts (shorter or longer), so "
        "tokens/s and prompts per minute can disagree:",
        "",
        *head,
    ]
    lines += [
        f"| {n} | "
        + " | ".join(_ppm(levels[c][n], levels[c].get(VLLM)) if n in levels[c] else "-" for c in levels)
        + " |"
        for n in names
    ]
    if any("texts" in levels[c].get(n, {}) for c in levels for n in names):
        lines += [
            "",
            "Texts (first repeat): how many loop (degenerate: >= 20% of word 4-grams repeated, "
            "pipelines/quality/) and how many ended by EOS, of the prompts. Looping tokens are easy "
            "to draft, so they flatter every speculative row's tokens/s:",
            "",
            *head,
        ]
        lines += [
            row(
                n,
                lambda x: (
                    (f"{x['texts']['degenerate']} loop, {x['texts']['finished_eos']} EOS / {x['texts']['n']}")
                    if "texts" in x
                    else "-"
                ),
            )
            for n in names
        ]
    lines += ["", "Decode-only tokens/s (a prefill estimate subtracted) and AAL:", "", *head]
    lines += [
        row(
            n,
            lambda x: (
                (f"{x['decode_tokens_per_s']:.1f}" if x.get("decode_tokens_per_s") is not None else "-")
                + (f" (aal {x['aal']:.2f})" if x.get("aal") is not None else "")
            ),
        )
        for n in names
    ]
    drafting = [n for n in names if any(levels[c].get(n, {}).get("proposer_ms_per_step") is not None for c in levels)]
    if drafting:
        lines += [
            "",
            "LASER's proposer: milliseconds inside `propose` per engine step, and draft tokens chosen per "
            "decoding row per step (medians of the repeats):",
            "",
            *head,
        ]
        lines += [row(n, lambda x: _drafting(x) or "-") for n in drafting]
    reuse = report.get("engine_reuse") or {}
    if reuse:
        lines += ["", "Engines (KV cache per engine; which rows kept one engine for all repeats):", ""]
        for c, r in reuse.items():
            lines.append(
                f"- c={c}: KV {r['kv_cache_gib']} GiB; one engine for all repeats: "
                f"{', '.join(r['one_engine_for_all_repeats']) or 'none'}; fresh engine per repeat: "
                f"{', '.join(r['fresh_engine_per_repeat']) or 'none'}"
            )
    lines.append("")
    lines += [f"- absent: {n}: {why}" for n, why in report["absent"].items()]
    lines += [_target_line(t, md=True) for t in report["targets"]]
    return "\n".join(lines) + "\n"


def plot_vllm_throughput(report: dict[str, Any], path: Path) -> Path:
    """Tokens/s against concurrency per method (median, the repeats' spread as error bars), and the measured
    vLLM step-cost curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cx) = plt.subplots(1, 2, figsize=(13, 4.8))
    levels = report["levels"]
    for name in _names(levels):
        cs = [c for c in levels if name in levels[c]]
        med = [levels[c][name]["tokens_per_s"] for c in cs]
        lo = [med[i] - levels[c][name].get("tokens_per_s_min", med[i]) for i, c in enumerate(cs)]
        hi = [levels[c][name].get("tokens_per_s_max", med[i]) - med[i] for i, c in enumerate(cs)]
        ax.errorbar([int(c) for c in cs], med, yerr=[lo, hi], marker="o", capsize=3, label=name)
    conc = [int(c) for c in levels]
    ax.set(
        xscale="log",
        xlabel="concurrency (requests in flight)",
        ylabel="tokens/s (prefill included)",
        title="throughput vs concurrency (vLLM engine; median, min-max)",
    )
    ax.set_xticks(conc, [str(c) for c in conc])
    ax.legend(fontsize=7)
    cost = report.get("cost_model")
    if cost:
        for b, r in zip(cost["rows"], cost["seconds"]):
            cx.plot(cost["nodes"], [1000 * t for t in r], marker=".", label=f"{b} rows")
        cx.set(
            xlabel="tokens per row in the step (1 + draft length)",
            ylabel="vLLM step ms",
            title="measured vLLM step cost",
        )
        cx.legend(fontsize=7)
    else:
        cx.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
