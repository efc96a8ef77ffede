"""`laser bench recommend`: beam vs atspeed (strict, relaxed) on generative recommendation.

Fixture: the synthetic demo data (old histories are the prompts, new histories the held-out items),
item titles as identifiers, the bundled model as target and a truncated copy of it as draft (untrained:
alignment training is not part of this benchmark). Methods run interleaved prompt by prompt after a
warm-up; each K prints walltime, speedup against ``beam``, beam steps per target forward, recall@K and
NDCG@K, and whether strict atspeed returned exactly ``beam``'s ranked items.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import laser
from laser.beam import ItemTrie
from pipelines.bench.report import machine_info
from pipelines.data.split import split_old_new
from pipelines.data.config import SyntheticParams
from pipelines.data.synthetic import synthetic_dataset
from pipelines.prompts import user_histories
from pipelines.recommend.items import item_identifiers, recommend_prompt
from pipelines.recommend.metrics import user_metrics

log = logging.getLogger(__name__)


@dataclass
class RecommendBenchSettings:
    model: str = laser.DEFAULT_MODEL
    draft: str = "truncate:8"
    gamma: int = 4
    N: int = 20
    Ks: tuple[int, ...] = (1, 3, 5, 10)
    users: int = 4
    threads: int = 2
    seed: int = 0


def fixture(s: RecommendBenchSettings, tokenizer, eos: int):
    ds = synthetic_dataset(SyntheticParams(n_users=12, n_items=24, n_clusters=3, max_history=16), seed=s.seed)
    split = split_old_new(ds, seed=s.seed, max_hist=8)
    hist = user_histories(split.old_interactions, ds.items)
    held = {u: set(g["item_id"].to_list()) for (u,), g in split.new_interactions.group_by(["user_id"])}
    users = [u for u in sorted(held) if hist.get(u)][: s.users]
    idents = item_identifiers(ds.items)
    trie = ItemTrie({i: tokenizer.encode(t, add_special_tokens=False) for i, t in idents.items()}, eos)
    return [recommend_prompt(hist[u], ds.domain, u, 10) for u in users], [held[u] for u in users], trie


def run_recommend_bench(json_out: Path, s: RecommendBenchSettings) -> dict:
    torch.set_num_threads(s.threads)
    lm = laser.load_model(s.model, device="cpu", dtype="float32")
    prompts, held, trie = fixture(s, lm.tokenizer, sorted(lm.eos_ids)[0])
    draft = laser.load_model(s.draft) if not s.draft.startswith("truncate:") else s.draft
    from laser.decoders.draft_model import load_draft

    draft_model, _ = load_draft(lm, draft)
    draft_lm = laser.LoadedModel(draft_model, lm.tokenizer, s.draft)
    results: dict = {"settings": asdict(s), "machine": machine_info(), "K": {}}
    for K in s.Ks:
        n = max(s.N, K)
        methods = {"beam": laser.get_decoder("beam", lm),
                   "atspeed strict": laser.get_decoder("atspeed", lm, draft=draft_lm, gamma=s.gamma, N=n),
                   "atspeed relaxed": laser.get_decoder("atspeed", lm, draft=draft_lm, gamma=s.gamma, N=n,
                                                        verification="relaxed")}
        for dec in methods.values():  # warm-up
            dec.recommend(prompts[0], trie, K)
        rows = {m: {"wall_s": 0.0, "forwards": 0, "steps": 0, "recall": 0.0, "ndcg": 0.0, "items": []} for m in methods}
        for prompt, h in zip(prompts, held):
            for name, dec in methods.items():
                t0 = time.perf_counter()
                rec = dec.recommend(prompt, trie, K)
                r = rows[name]
                r["wall_s"] += time.perf_counter() - t0
                r["forwards"] += rec.stats.target_forwards
                r["steps"] += rec.beam_steps
                rc, nd = user_metrics([i for i, _ in rec.items], h, K)
                r["recall"] += rc / len(prompts)
                r["ndcg"] += nd / len(prompts)
                r["items"].append([i for i, _ in rec.items])
        for name, r in rows.items():
            r["speedup"] = rows["beam"]["wall_s"] / r["wall_s"]
            r["steps_per_forward"] = r["steps"] / r["forwards"]
            r["same_as_beam"] = r["items"] == rows["beam"]["items"]
        results["K"][K] = rows
        for name, r in rows.items():
            print(f"K={K:3d} {name:16s} wall {r['wall_s']:7.2f}s speedup {r['speedup']:.2f}x steps/forward "
                  f"{r['steps_per_forward']:.2f} recall@K {r['recall']:.3f} NDCG@K {r['ndcg']:.3f} "
                  f"same top-K as beam: {r['same_as_beam']}", flush=True)
    json_out.write_text(json.dumps(results, indent=1, default=str))
    return results
