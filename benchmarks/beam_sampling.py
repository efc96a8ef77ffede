"""Beam-sampling study: the target's own beam sampling (``beam_sample``) against DSBD with the dynamic
width (``dsbd``) and DSBD's memory-saving one-cache variant (``dsbd_one_cache``), on the same prompts and
seeds, one request at a time after a warm-up.

Reported per method (plain dicts, summed over every prompt x seed): wall, prefill and decode seconds,
target forwards (decoding forwards, prefill excluded), beam layers advanced per forward, the mean layer
width (dynamic width: the W_L chosen per layer, so a weak draft can make dsbd sample fewer beams), returned tokens
per wall second, the speedup of wall and decode seconds against ``beam_sample``, the draft model's share
of decoding (drafting seconds / decode seconds), the forest size (input beams, tree nodes per forward)
and the quality of the returned sequences: each is scored by one teacher-forced target forward, so every
method is scored identically (mean target log-probability per token, over all returned tokens, and per
sequence, the mean of each sequence's total).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch

import laser
from laser.models import LoadedModel
from laser.sampling import SamplingParams

BASELINE = "beam_sample"
METHODS = (BASELINE, "dsbd", "dsbd_one_cache")
DSBD_VARIANTS = {
    "dsbd": {"dynamic": True},
    "dsbd_one_cache": {"dynamic": True, "one_cache": True},
    "dsbd_fixed": {"dynamic": False},
}  # dsbd_fixed (width W at every layer): on request


def study_decoders(
    lm: LoadedModel,
    draft_lm: LoadedModel | str | None,
    W: int,
    gamma: int,
    W_S: int,
    t: float = 0.7,
    W_min: int = 1,
    methods: Sequence[str] = METHODS,
) -> dict[str, Any]:
    """{method: decoder} for ``beam_sample`` and the DSBD variants named in ``methods`` (one draft model)."""
    out: dict[str, Any] = {BASELINE: laser.get_decoder(BASELINE, lm, W=W)}
    draft = draft_lm
    for m in methods:
        if m == BASELINE:
            continue
        if m not in DSBD_VARIANTS:
            raise ValueError(f"unknown method {m!r}; choose from {[BASELINE, *DSBD_VARIANTS]}")
        out[m] = laser.get_decoder(
            "dsbd", lm, draft=draft, gamma=gamma, W=W, W_S=W_S, t=t, W_min=W_min, **DSBD_VARIANTS[m]
        )
        draft = LoadedModel(out[m].draft_model, lm.tokenizer, out[m].draft_name)  # loaded once, shared
    return out


def decode_one(dec: Any, ids: list[int], max_new_tokens: int, seed: int) -> dict[str, Any]:
    """One request: its returned tokens, seconds, forwards and per-forward beam figures."""
    req = dec.request(list(ids), max_new_tokens, sampling=SamplingParams(1.0, seed=seed))
    t0 = time.perf_counter()
    dec.engine.run([req])
    wall = time.perf_counter() - t0
    st, stats = req.state, req.stats
    return {
        "tokens": list(req.new_tokens),
        "wall_s": wall,
        "prefill_s": stats.prefill_s,
        "decode_s": max(stats.decode_s, wall - stats.prefill_s),
        "drafting_s": stats.retrieval_s,
        "forwards": int(stats.target_forwards),
        "layers": list(st.layers_per_forward),
        "widths": list(st.widths),
        "inputs": list(st.inputs),
        "forest_nodes": list(st.forest_nodes),
    }


@torch.no_grad()
def target_log_probs(lm: LoadedModel, ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """Per-token target log-probabilities of ``tokens`` after ``ids``, teacher-forced in one forward (fp32)."""
    if not tokens:
        return np.zeros(0)
    device = next(lm.model.parameters()).device
    seq = torch.tensor([list(ids) + list(tokens)], device=device)
    logits = lm.model(seq).logits[0, len(ids) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1).gather(1, seq[0, len(ids) :, None])[:, 0]
    return lp.double().cpu().numpy()


def summarise(runs: list[dict[str, Any]], scores: list[np.ndarray]) -> dict[str, Any]:
    """One method's totals and rates over its runs."""
    tokens = sum(len(r["tokens"]) for r in runs)
    wall, decode = sum(r["wall_s"] for r in runs), sum(r["decode_s"] for r in runs)
    forwards = sum(r["forwards"] for r in runs)
    layers = [n for r in runs for n in r["layers"]]
    nodes = [n for r in runs for n in r["forest_nodes"]]
    inputs = [n for r in runs for n in r["inputs"]]
    return {
        "runs": len(runs),
        "tokens": tokens,
        "wall_s": wall,
        "prefill_s": sum(r["prefill_s"] for r in runs),
        "decode_s": decode,
        "target_forwards": forwards,
        "layers_per_forward": float(np.mean(layers)) if layers else 0.0,
        "mean_width": float(np.mean([w for r in runs for w in r["widths"]] or [0.0])),
        "tokens_per_s": tokens / wall if wall else 0.0,
        "drafting_share": sum(r["drafting_s"] for r in runs) / decode if decode else 0.0,
        "mean_input_beams": float(np.mean(inputs)) if inputs else 0.0,
        "mean_forest_nodes": float(np.mean(nodes)) if nodes else 0.0,
        "max_forest_nodes": max(nodes, default=0),
        "logprob_per_token": float(np.concatenate(scores).sum() / tokens) if tokens else 0.0,
        "logprob_per_sequence": float(np.mean([s.sum() for s in scores])) if scores else 0.0,
    }


def run_beam_sampling_study(
    lm: LoadedModel,
    draft_lm: LoadedModel | str | None,
    prompts: Sequence[Sequence[int]] | Mapping[str, Sequence[int]],
    W: int = 4,
    gamma: int = 4,
    W_S: int = 8,
    seeds: Sequence[int] = (0,),
    max_new_tokens: int = 64,
    t: float = 0.7,
    W_min: int = 1,
    warmup: bool = True,
    methods: Sequence[str] = METHODS,
) -> dict[str, Any]:
    """Measure ``beam_sample`` and the DSBD ``methods`` (default ``dsbd``, ``dsbd_one_cache``; also
    ``dsbd_fixed``) on every prompt x seed, interleaved; returns {"settings": ..., "methods": {method:
    figures}} with speedups against ``beam_sample``."""
    items = [list(p) for p in (prompts.values() if isinstance(prompts, Mapping) else prompts)]
    if not items or not seeds:
        raise ValueError("the beam-sampling study needs at least one prompt and one seed")
    decoders = study_decoders(lm, draft_lm, W, gamma, W_S, t, W_min, methods)
    names = list(decoders)
    if warmup:
        for dec in decoders.values():
            decode_one(dec, items[0], min(8, max_new_tokens), seed=0)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in names}
    cuda = torch.cuda.is_available() and next(lm.model.parameters()).is_cuda
    peak: dict[str, int] = {m: 0 for m in names}
    for ids in items:
        for seed in seeds:
            for m in names:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                runs[m].append(decode_one(decoders[m], ids, max_new_tokens, int(seed)))
                if cuda:
                    peak[m] = max(peak[m], torch.cuda.max_memory_allocated())
    figures = {}
    for m in names:
        scores = [target_log_probs(lm, ids, r["tokens"]) for ids, r in zip(_pairs(items, seeds), runs[m])]
        figures[m] = summarise(runs[m], scores)
        if cuda:
            figures[m]["peak_memory_mib"] = peak[m] / 2**20
    base = figures[BASELINE]
    for fig in figures.values():
        fig["speedup"] = base["wall_s"] / fig["wall_s"] if fig["wall_s"] else 0.0
        fig["decode_speedup"] = base["decode_s"] / fig["decode_s"] if fig["decode_s"] else 0.0
    settings = {
        "W": W,
        "gamma": gamma,
        "W_S": W_S,
        "t": t,
        "W_min": W_min,
        "seeds": [int(s) for s in seeds],
        "prompts": len(items),
        "max_new_tokens": max_new_tokens,
        "draft": decoders[names[-1]].draft_name if len(names) > 1 else None,
        "device": str(next(lm.model.parameters()).device),
    }
    return {"settings": settings, "methods": figures}


def _pairs(items: list[list[int]], seeds: Sequence[int]) -> list[list[int]]:
    """The prompt of every run, in run order (each prompt once per seed)."""
    return [ids for ids in items for _ in seeds]
