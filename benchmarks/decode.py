"""`laser bench decode`: decoders side by side on user-profile generation with the bundled model.

Fixture: the synthetic demo data's old histories are answered once by greedy decoding (the "earlier
knowledge"), cached on disk by :mod:`benchmarks.fixture`. New histories of
a few users are the measured prompts. Pools: ReSD gets one global pool of every old profile; LASER
gets the pool of the user's taste group (the synthetic data's planted cluster stands in for the
router's collaborative group here).

Methods run interleaved prompt by prompt (so machine noise hits all alike) after a warm-up, and are
compared with transformers' greedy ``generate`` in the same process.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import laser
from laser.defaults import N_MAX, RELAXED_K, RELAXED_P
from benchmarks.fixture import encode_user_prompts, greedy_knowledge
from benchmarks.report import hf_generate, machine_info, print_methods, summarise, timed_decode, versions
from pipelines.data.split import split_old_new
from pipelines.data.synthetic import generate as synthetic_generate
from pools import RetrievalPool

log = logging.getLogger(__name__)

REFERENCE = "transformers generate"


@dataclass
class DecodeBenchSettings:
    model: str = laser.DEFAULT_MODEL
    threads: int = 2
    users: int = 6  # measured prompts
    old_users: int = 48  # earlier profiles that fill the pools
    max_new_tokens: int = 160
    max_prompt_tokens: int = 512
    seed: int = 0
    K: int | str = "auto"  # draft budget: "auto" (adaptive, the default) or fixed tree nodes
    n_max: int = N_MAX
    k: int = RELAXED_K
    p: float = RELAXED_P


# name -> (decoder, params, pool kind); "draft" / "rule" add the settings' draft budget / k and p
METHODS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "autoregressive": ("autoregressive", {}, None),
    "resd (global pool)": ("resd", {"draft": True}, "global"),
    "laser greedy": ("laser", {"verification": "greedy", "draft": True}, "group"),
    "laser relaxed": ("laser", {"verification": "relaxed", "draft": True, "rule": True}, "group"),
}


def method_params(params: dict, settings: DecodeBenchSettings) -> dict:
    """A method's decoder parameters with the settings' draft budget and relaxed rule where it asks for them."""
    out = {k: v for k, v in params.items() if k not in ("draft", "rule")}
    if params.get("draft"):
        out.update(K=settings.K, n_max=settings.n_max)
    if params.get("rule"):
        out.update(k=settings.k, p=settings.p)
    return out


def run_decode_bench(json_out: Path, settings: DecodeBenchSettings, cache_root: Path | None = None) -> dict:
    torch.set_num_threads(settings.threads)
    lm = laser.load_model(settings.model, device="cpu", dtype="float32")
    prompts, old_prompts, cluster = _prompts(lm, settings)
    profiles = greedy_knowledge(lm, old_prompts, settings.max_new_tokens, cache_root, desc="earlier profiles")
    global_pool = RetrievalPool.from_token_ids(list(profiles.values()))
    groups: dict[int, RetrievalPool] = {}
    for user, ids in profiles.items():
        groups.setdefault(cluster[user], RetrievalPool()).add(ids)

    decoders = {
        name: laser.get_decoder(d, lm, **method_params(params, settings)) for name, (d, params, _) in METHODS.items()
    }
    pool_of = lambda kind, c: {"global": global_pool, "group": groups.get(c)}.get(kind)  # noqa: E731

    first = next(iter(prompts.values()))
    hf_generate(lm, first, 8)  # warm-up
    for d in decoders.values():
        d.generate(first, 8)
    rows: dict[str, list] = {REFERENCE: [], **{m: [] for m in METHODS}}
    for user, ids in tqdm(prompts.items(), desc="bench decode", unit="prompt"):
        rows[REFERENCE].append(hf_generate(lm, ids, settings.max_new_tokens))
        for name, (_, _, kind) in METHODS.items():
            rows[name].append(timed_decode(decoders[name], ids, settings.max_new_tokens, pool_of(kind, cluster[user])))
    report = {
        "settings": asdict(settings),
        "methods": summarise(rows, REFERENCE),
        "pool_nodes": {"global": len(global_pool), "groups": {c: len(p) for c, p in groups.items()}},
        "machine": machine_info(),
        "versions": versions(),
    }
    print_methods(f"bench decode: {settings.model}, {settings.threads} threads", report["methods"])
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2))
    return report


def _prompts(lm, s: DecodeBenchSettings) -> tuple[dict[str, list[int]], dict[str, list[int]], dict[str, int]]:
    """Prompt ids of measured users' new histories and of other users' old histories; each user's cluster."""
    ds, truth = synthetic_generate(seed=s.seed)
    split = split_old_new(ds, seed=s.seed)
    cluster = dict(zip(truth["user_id"].to_list(), truth["cluster"].to_list()))
    new_users = set(split.new_interactions["user_id"].to_list())
    old_users = set(split.old_interactions["user_id"].to_list())
    counts = dict(split.new_interactions.group_by("user_id").len().iter_rows())
    measured = [u for u in sorted(new_users & old_users) if counts[u] >= 3][: s.users]
    others = [u for u in sorted(old_users) if u not in measured][: s.old_users]
    return (
        encode_user_prompts(lm, split.new_interactions, ds, measured, s.max_prompt_tokens),
        encode_user_prompts(lm, split.old_interactions, ds, others, s.max_prompt_tokens),
        cluster,
    )
