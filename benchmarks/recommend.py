"""`laser bench recommend`: the AtSpeed paper's tables on generative recommendation, and DSBD against beam
sampling.

Fixture: a dataset (the recommendation demo data, or ``--dataset-config``) split into old and new
histories; each measured user's prompt is the old history, its held-out items the new one; item titles
(with year) are the identifiers, in a token trie. Per K, on the same users, one request at a time after
a warm-up, methods interleaved user by user:

- ``beam`` (the reference), ``atspeed strict`` with the given draft, ``atspeed strict (aligned)`` with a
  draft trained by ``laser train-align --mode strict``, ``atspeed relaxed`` and ``atspeed relaxed
  (aligned)`` (``--mode relaxed``), the aligned ones when given;
- wall seconds (prefill included) and decode seconds (prefill excluded), walltime speedup WS@K against
  ``beam`` (both), accepted beam steps per target forward (AS@K, the paper's), recall@K and NDCG@K against
  the held-out items, and whether strict returned exactly ``beam``'s ranked items (and the largest score
  difference: fp32 forwards over different trees differ in the last bits).

The DSBD section runs ``benchmarks.beam_sampling`` on the users' knowledge prompts: beam sampling
against DSBD (dynamic width, one-cache variant): speed and mean target log-probability of the returned
sequences. Output: JSON, Markdown and a PNG beside the JSON.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import laser
from laser.decoders.beam.search import ItemTrie
from benchmarks.report import machine_info
from pipelines.data.config import DatasetConfig, SyntheticParams
from pipelines.data.load import load_dataset
from pipelines.data.split import split_old_new
from pipelines.knowledge.prompts import user_histories
from pipelines.recommend.items import item_identifiers, recommend_prompt
from pipelines.recommend.metrics import user_metrics
from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)

DEMO_DATA = DatasetConfig(
    format="synthetic", seed=0, synthetic=SyntheticParams(n_users=12, n_items=24, n_clusters=3, max_history=16)
)


@dataclass
class RecommendBenchSettings:
    model: str = laser.DEFAULT_MODEL
    draft: str = "truncate:2"
    aligned_strict: str | None = None  # a draft from `laser train-align --mode strict`
    aligned_relaxed: str | None = None  # a draft from `laser train-align --mode relaxed`
    gamma: int = 4
    N: int = 30  # draft beams (max(N, K) at each K)
    Ks: tuple[int, ...] = (1, 3, 5, 10, 20)
    users: int = 6
    max_history: int = 10
    threads: int = 1
    seed: int = 0
    dataset: DatasetConfig | None = None  # None: the recommendation demo data
    dsbd_draft: str | None = None  # None: ``draft``
    dsbd_W: int = 4
    dsbd_gamma: int = 2
    dsbd_W_S: int = 4
    dsbd_tokens: int = 32
    dsbd_prompts: int = 3  # 0: no DSBD section
    seeds: tuple[int, ...] = (0, 1)


@dataclass
class Fixture:
    prompts: list[str]
    held_out: list[set[str]]
    trie: ItemTrie
    knowledge_prompts: list[list[int]] = field(default_factory=list)


def fixture(s: RecommendBenchSettings, lm: laser.LoadedModel) -> Fixture:
    """Measured users' recommendation prompts, held-out items and the item trie (and knowledge prompts)."""
    from benchmarks.fixture import encode_user_prompts

    ds = load_dataset(s.dataset or DEMO_DATA)
    split = split_old_new(ds, seed=s.seed, max_hist=8)
    hist = user_histories(split.old_interactions, ds.items)
    held = {u: set(g["item_id"].to_list()) for (u,), g in split.new_interactions.group_by(["user_id"])}
    users = [u for u in sorted(held) if hist.get(u)][: s.users]
    if not users:
        raise ValueError("no user has both an old and a new history: nothing to recommend from")
    if lm.tokenizer is None:
        raise ValueError(f"bench recommend: model {lm.name!r} has no tokenizer: item titles need one")
    eos = sorted(lm.eos_ids)[0]
    trie = ItemTrie(
        {i: lm.tokenizer.encode(t, add_special_tokens=False) for i, t in item_identifiers(ds.items).items()}, eos
    )
    knowledge = list(encode_user_prompts(lm, split.old_interactions, ds, users[: s.dsbd_prompts], 512).values())
    return Fixture(
        [recommend_prompt(hist[u], ds.domain, u, s.max_history) for u in users],
        [held[u] for u in users],
        trie,
        knowledge,
    )


def methods_for(s: RecommendBenchSettings, lm: laser.LoadedModel, drafts: dict[str, Any], K: int) -> dict[str, Any]:
    n = max(s.N, K)

    def atspeed(draft: Any, mode: str) -> laser.Decoder:
        return laser.get_decoder("atspeed", lm, draft=draft, gamma=s.gamma, N=n, verification=mode, seed=s.seed)

    out = {"beam": laser.get_decoder("beam", lm), "atspeed strict": atspeed(drafts["draft"], "strict")}
    if "strict" in drafts:
        out["atspeed strict (aligned)"] = atspeed(drafts["strict"], "strict")
    out["atspeed relaxed"] = atspeed(drafts["draft"], "relaxed")
    if "relaxed" in drafts:
        out["atspeed relaxed (aligned)"] = atspeed(drafts["relaxed"], "relaxed")
    return out


def load_drafts(s: RecommendBenchSettings, lm: laser.LoadedModel) -> dict[str, Any]:
    """Each draft loaded once, shared by the decoders of every K."""
    names = {"draft": s.draft, "strict": s.aligned_strict, "relaxed": s.aligned_relaxed}
    return {key: draft_lm(lm, name) for key, name in names.items() if name}


def draft_lm(lm: laser.LoadedModel, name: str) -> laser.LoadedModel:
    """The draft ``name`` (model-cache name, path or truncate:N) for ``lm``, with the target's tokenizer."""
    from laser.decoders.draft_model.decoders import load_draft

    model, canonical = load_draft(lm, name)
    return laser.LoadedModel(model, lm.tokenizer, canonical)


def measure_k(s: RecommendBenchSettings, fx: Fixture, decoders: dict[str, Any], K: int) -> dict[str, dict]:
    """Every method on every user at width K (interleaved), totals and means."""
    for dec in decoders.values():  # warm-up
        dec.recommend(fx.prompts[0], fx.trie, K)
    rows: dict[str, dict[str, Any]] = {
        m: {
            "wall_s": 0.0,
            "decode_s": 0.0,
            "prefill_s": 0.0,
            "forwards": 0,
            "steps": 0,
            "recall": 0.0,
            "ndcg": 0.0,
            "items": [],
            "scores": [],
        }
        for m in decoders
    }
    for prompt, held in zip(fx.prompts, fx.held_out):
        for name, dec in decoders.items():
            t0 = time.perf_counter()
            rec = dec.recommend(prompt, fx.trie, K)
            r = rows[name]
            wall = time.perf_counter() - t0
            r["wall_s"] += wall
            r["prefill_s"] += rec.stats.prefill_s
            r["decode_s"] += wall - rec.stats.prefill_s  # drafting, forwards, verification (draft prefill too)
            r["forwards"] += rec.stats.target_forwards
            r["steps"] += rec.beam_steps
            rc, nd = user_metrics([i for i, _ in rec.items], held, K)
            r["recall"] += rc / len(fx.prompts)
            r["ndcg"] += nd / len(fx.prompts)
            r["items"].append([i for i, _ in rec.items])
            r["scores"].append([sc for _, sc in rec.items])
    base = rows["beam"]
    for r in rows.values():
        r["speedup"] = base["wall_s"] / r["wall_s"]
        r["decode_speedup"] = base["decode_s"] / r["decode_s"]
        r["steps_per_forward"] = r["steps"] / r["forwards"]
        r["same_as_beam"] = r["items"] == base["items"]
        r["max_score_diff"] = max(abs(a - b) for x, y in zip(r["scores"], base["scores"]) for a, b in zip(x, y))
    return rows


def run_recommend_bench(json_out: Path, s: RecommendBenchSettings) -> dict:
    torch.set_num_threads(s.threads)
    lm = laser.load_model(s.model, device="cpu", dtype="float32")
    fx = fixture(s, lm)
    drafts = load_drafts(s, lm)
    results: dict = {
        "settings": {**asdict(s), "dataset": (s.dataset or DEMO_DATA).model_dump()},
        "machine": machine_info(),
        "load_avg_start": os.getloadavg(),
        "items": len(fx.trie),
        "users": len(fx.prompts),
        "K": {},
    }
    for K in s.Ks:
        if K > len(fx.trie):
            log.warning("K=%d is larger than the catalogue (%d items): skipped", K, len(fx.trie))
            continue
        rows = measure_k(s, fx, methods_for(s, lm, drafts, K), K)
        results["K"][K] = rows
        for name, r in rows.items():
            print(
                f"K={K:3d} {name:26s} wall {r['wall_s']:7.2f}s WS {r['speedup']:.2f}x decode WS "
                f"{r['decode_speedup']:.2f}x AS {r['steps_per_forward']:.2f} recall@K {r['recall']:.3f} "
                f"NDCG@K {r['ndcg']:.3f} same as beam {r['same_as_beam']}",
                flush=True,
            )
        _write(json_out, results)  # partial results survive an interrupted run
    if s.dsbd_prompts and fx.knowledge_prompts:
        from benchmarks.beam_sampling import run_beam_sampling_study

        results["dsbd"] = run_beam_sampling_study(
            lm,
            draft_lm(lm, s.dsbd_draft or s.draft),
            fx.knowledge_prompts,
            W=s.dsbd_W,
            gamma=s.dsbd_gamma,
            W_S=s.dsbd_W_S,
            seeds=s.seeds,
            max_new_tokens=s.dsbd_tokens,
        )
        for name, f in results["dsbd"]["methods"].items():
            print(
                f"DSBD {name:16s} wall {f['wall_s']:7.2f}s speedup {f['speedup']:.2f}x layers/forward "
                f"{f['layers_per_forward']:.2f} log-prob/token {f['logprob_per_token']:.3f}",
                flush=True,
            )
    results["load_avg_end"] = os.getloadavg()
    _write(json_out, results)
    json_out.with_suffix(".md").write_text(markdown(results))
    plot(results, json_out.with_suffix(".png"))
    return results


def _write(path: Path, results: dict) -> None:
    slim = json.loads(json.dumps(results, default=str))
    for rows in slim["K"].values():
        for r in rows.values():
            r.pop("scores", None)
    atomic_write_local(path, lambda tmp: Path(tmp).write_text(json.dumps(slim, indent=1)))


def markdown(res: dict) -> str:
    s = res["settings"]
    lines = [
        "# laser bench recommend\n",
        f"Target `{s['model']}`, draft `{s['draft']}` (aligned strict: `{s['aligned_strict']}`, relaxed: "
        f"`{s['aligned_relaxed']}`), gamma={s['gamma']}, N=max({s['N']}, K); {res['users']} users, "
        f"{res['items']} items; {s['threads']} torch thread(s); load average {res['load_avg_start'][0]:.1f} "
        f"at start, {res.get('load_avg_end', [float('nan')])[0]:.1f} at end. One request at a time, methods "
        "interleaved per user. WS = walltime speedup against `beam` (prefill included); decode WS excludes "
        "the target's prefill; AS = beam steps per target forward.\n",
        "| K | method | wall s | WS@K | decode WS@K | AS@K | recall@K | NDCG@K | same top-K as beam |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for K, rows in res["K"].items():
        for name, r in rows.items():
            same = "yes" if r["same_as_beam"] else "no"
            lines.append(
                f"| {K} | {name} | {r['wall_s']:.2f} | {r['speedup']:.2f}x | {r['decode_speedup']:.2f}x | "
                f"{r['steps_per_forward']:.2f} | {r['recall']:.3f} | {r['ndcg']:.3f} | {same} |"
            )
    if "dsbd" in res:
        d = res["dsbd"]["settings"]
        lines += [
            "",
            "## DSBD against beam sampling\n",
            f"W={d['W']}, gamma={d['gamma']}, W_S={d['W_S']}, t={d['t']}, draft `{d['draft']}`, {d['prompts']} "
            f"knowledge prompts x seeds {d['seeds']}, {d['max_new_tokens']} new tokens.\n",
            "| method | wall s | speedup | decode speedup | layers/forward | mean width | log-prob/token | "
            "log-prob/sequence |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, f in res["dsbd"]["methods"].items():
            lines.append(
                f"| {name} | {f['wall_s']:.2f} | {f['speedup']:.2f}x | {f['decode_speedup']:.2f}x | "
                f"{f['layers_per_forward']:.2f} | {f['mean_width']:.2f} | {f['logprob_per_token']:.3f} | "
                f"{f['logprob_per_sequence']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ks = [int(k) for k in res["K"]]
    names = list(next(iter(res["K"].values()))) if ks else []
    for name in names:
        rows = [res["K"][k if k in res["K"] else str(k)][name] for k in ks]
        a.plot(ks, [r["speedup"] for r in rows], marker="o", label=name)
        b.plot(ks, [r["steps_per_forward"] for r in rows], marker="o", label=name)
    a.set(xlabel="K (beam width = items recommended)", ylabel="walltime speedup vs beam", title="WS@K")
    b.set(xlabel="K", ylabel="beam steps per target forward", title="AS@K")
    a.axhline(1.0, color="grey", lw=0.8)
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
