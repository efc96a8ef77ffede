"""`laser bench decode`: decoders side by side on user-profile generation with the bundled model.

Fixture: the synthetic demo data's old histories are answered once by greedy decoding (the "earlier
knowledge"), cached on disk under a key of model + prompt version + data settings. New histories of
a few users are the measured prompts. Pools: ReSD gets one global pool of every old profile; LASER
gets the pool of the user's taste group (the synthetic data's planted cluster stands in for the
router's collaborative group here).

Methods run interleaved prompt by prompt (so machine noise hits all alike) after a warm-up, and are
compared with transformers' greedy ``generate`` in the same process.
"""
from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

import laser
from pipelines.data.split import split_old_new
from pipelines.data.synthetic import generate as synthetic_generate
from pipelines.prompts import PROMPT_VERSION, user_histories, user_prompt
from pools import RetrievalPool

log = logging.getLogger(__name__)


@dataclass
class DecodeBenchSettings:
    model: str = laser.DEFAULT_MODEL
    threads: int = 2
    users: int = 6  # measured prompts
    old_users: int = 48  # earlier profiles that fill the pools
    max_new_tokens: int = 160
    max_prompt_tokens: int = 512
    seed: int = 0
    K: int = 64
    n_max: int = 8
    k: int = 2
    p: float = 0.1


METHODS = {  # name -> (decoder, params, pool kind)
    "autoregressive": ("autoregressive", {}, None),
    "resd (global pool)": ("resd", {}, "global"),
    "laser greedy": ("laser", {"verification": "greedy"}, "group"),
    "laser relaxed": ("laser", {"verification": "relaxed"}, "group"),
}


def run_decode_bench(json_out: Path, settings: DecodeBenchSettings, cache_root: Path | None = None) -> dict:
    torch.set_num_threads(settings.threads)
    lm = laser.load_model(settings.model, device="cpu", dtype="float32")
    prompts, old = _prompts(lm, settings)
    profiles = _old_profiles(lm, old, settings, cache_root or laser.models.cache_dir() / "bench")
    global_pool = RetrievalPool.from_token_ids([ids for _, ids in profiles.values()])
    groups: dict[int, RetrievalPool] = {}
    for cluster, ids in profiles.values():
        groups.setdefault(cluster, RetrievalPool()).add(ids)

    common = {"K": settings.K, "n_max": settings.n_max}
    decoders = {name: laser.get_decoder(d, lm, **(common if d != "autoregressive" else {}), **params,
                                        **({"k": settings.k, "p": settings.p} if d == "laser" else {}))
                for name, (d, params, _) in METHODS.items()}
    pool_of = lambda kind, cluster: {"global": global_pool, "group": groups.get(cluster)}.get(kind)  # noqa: E731

    _warm_up(lm, decoders, prompts[0][1])
    rows: dict[str, list[dict]] = {"transformers generate": [], **{m: [] for m in METHODS}}
    for cluster, ids in tqdm(prompts, desc="bench decode", unit="prompt"):
        ref, secs = _hf_generate(lm, ids, settings.max_new_tokens)
        rows["transformers generate"].append({"tokens": ref, "seconds": secs, "stats": None})
        for name, (_, _, kind) in METHODS.items():
            out = decoders[name].generate(ids, settings.max_new_tokens, pool=pool_of(kind, cluster))
            rows[name].append({"tokens": out.token_ids, "seconds": out.stats.prefill_s + out.stats.decode_s,
                               "stats": out.stats})
    report = _summarise(rows, settings, len(global_pool), {c: len(p) for c, p in groups.items()})
    _print(report)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2))
    return report


def _prompts(lm, s: DecodeBenchSettings) -> tuple[list[tuple[int, list[int]]], list[tuple[str, int, list[int]]]]:
    """(cluster, prompt ids) for measured users' new histories; (user, cluster, ids) for old histories."""
    ds, truth = synthetic_generate(seed=s.seed)
    split = split_old_new(ds, seed=s.seed)
    cluster = dict(zip(truth["user_id"].to_list(), truth["cluster"].to_list()))
    encode = laser.get_decoder("autoregressive", lm).encode
    render = lambda uid, hist: encode(user_prompt(hist, ds.domain, user_id=uid, tokenizer=lm.tokenizer,  # noqa: E731
                                                  max_prompt_tokens=s.max_prompt_tokens))
    new_hist = user_histories(split.new_interactions, ds.items)
    old_hist = user_histories(split.old_interactions, ds.items)
    measured = [u for u in sorted(new_hist) if u in old_hist and len(new_hist[u]) >= 3][: s.users]
    old_users = [u for u in sorted(old_hist) if u not in measured][: s.old_users]
    return ([(cluster[u], render(u, new_hist[u])) for u in measured],
            [(u, cluster[u], render(u, old_hist[u])) for u in old_users])


def _old_profiles(lm, old, s: DecodeBenchSettings, root: Path) -> dict[str, tuple[int, list[int]]]:
    """Greedy profiles for old histories, cached on disk (key: model, prompt version, data, lengths)."""
    key = hashlib.sha256(json.dumps([s.model, PROMPT_VERSION, s.seed, s.max_new_tokens, s.max_prompt_tokens,
                                     [ids for _, _, ids in old]]).encode()).hexdigest()[:16]
    path = root / f"old-profiles-{key}.json"
    if path.exists():
        return {u: (c, ids) for u, (c, ids) in json.loads(path.read_text()).items()}
    log.info("Generating %d earlier profiles with greedy decoding (cached in %s)", len(old), path)
    decoder = laser.get_decoder("autoregressive", lm)
    out: dict[str, tuple[int, list[int]]] = {}
    batch = 8
    for start in tqdm(range(0, len(old), batch), desc="earlier profiles", unit="batch"):
        chunk = old[start:start + batch]
        gens = decoder.generate_batch([ids for _, _, ids in chunk], s.max_new_tokens)
        for (u, c, _), g in zip(chunk, gens):
            out[u] = (c, _strip_eos(lm, g.token_ids))
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return out


def _strip_eos(lm, ids: list[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in lm.eos_ids else ids


def _hf_generate(lm, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    out = lm.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def _warm_up(lm, decoders, ids: list[int]) -> None:
    _hf_generate(lm, ids, 8)
    for d in decoders.values():
        d.generate(ids, 8)


def _summarise(rows: dict[str, list[dict]], s: DecodeBenchSettings, global_nodes: int, group_nodes: dict) -> dict:
    ref_rows = rows["transformers generate"]
    base_tps = sum(len(r["tokens"]) for r in ref_rows) / sum(r["seconds"] for r in ref_rows)
    methods = {}
    for name, rs in rows.items():
        tokens = sum(len(r["tokens"]) for r in rs)
        tps = tokens / sum(r["seconds"] for r in rs)
        stats = [r["stats"] for r in rs if r["stats"] is not None]
        steps = sum(st.target_forwards for st in stats)
        overhead = sum(st.retrieval_s + st.tree_s + st.verify_s + st.cache_s for st in stats)
        methods[name] = {
            "tokens_per_s": tps,
            "speedup_vs_generate": tps / base_tps,
            "aal": (sum(sum(st.accepted_per_step) for st in stats) + steps) / steps if steps else 1.0,
            "art_ms_per_step": 1000 * sum(st.retrieval_s for st in stats) / steps if steps else 0.0,
            "overhead_share_of_step": overhead / sum(st.decode_s for st in stats) if stats else 0.0,
            "mean_new_tokens": tokens / len(rs),
            "length_ratio_vs_greedy": tokens / sum(len(r["tokens"]) for r in ref_rows),
            "identical_to_greedy": all(r["tokens"] == ref["tokens"] for r, ref in zip(rs, ref_rows)),
            "time_breakdown_s": {f: sum(getattr(st, f) for st in stats) for f in
                                 ("prefill_s", "retrieval_s", "tree_s", "forward_s", "verify_s", "cache_s")},
        }
    return {"settings": asdict(s), "methods": methods, "pool_nodes": {"global": global_nodes, "groups": group_nodes},
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "torch_threads": torch.get_num_threads()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "laser": "0.1.0",
                         "prompt_version": PROMPT_VERSION}}


def _print(report: dict) -> None:
    table = Table(title=f"bench decode: {report['settings']['model']}, {report['settings']['threads']} threads")
    for col in ("method", "tokens/s", "speedup", "AAL", "ART ms/step", "overhead", "new tokens", "len ratio", "= greedy"):
        table.add_column(col, justify="right")
    for name, m in report["methods"].items():
        table.add_row(name, f"{m['tokens_per_s']:.1f}", f"{m['speedup_vs_generate']:.2f}x", f"{m['aal']:.2f}",
                      f"{m['art_ms_per_step']:.2f}", f"{100 * m['overhead_share_of_step']:.1f}%",
                      f"{m['mean_new_tokens']:.0f}", f"{m['length_ratio_vs_greedy']:.2f}",
                      "yes" if m["identical_to_greedy"] else "no")
    Console().print(table)
