"""Train the ReDrafter head used by `laser bench suite --study redrafter` on the target's greedy answers that
are already cached: the bench fixture's earlier user profiles and item descriptions (prompts rebuilt as the
suite builds them, answers looked up by prompt content, hidden states by one forward each), plus the
examples a `laser train-redrafter` run generated in its work folder (--generated). Nothing is generated.

    python scripts/train_redrafter_bench_head.py --name smollm2-135m-redrafter --steps 150 \
        --generated /tmp/rd/runs/redrafter/smollm2-135m-redrafter --workdir /tmp/rd/bench-head
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

import laser
from benchmarks.fixture import default_cache_root, encode_item_prompts, encode_user_prompts, prompt_key
from benchmarks.suite import SuiteSettings
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset
from pipelines.data.split import split_old_new
from pipelines.knowledge.prompts import PROMPT_VERSION
from training.redrafter import TrainSettings, extract_features, fit_and_save, generated_examples

import hashlib


def cached_pairs(lm, s: SuiteSettings) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) of every old user / existing item whose greedy answer is in the fixture cache."""
    name = hashlib.sha256(json.dumps([lm.name, PROMPT_VERSION, s.knowledge_tokens]).encode()).hexdigest()[:16]
    cache = json.loads((default_cache_root() / f"greedy-{name}.json").read_text())
    ds = load_dataset(DatasetConfig(seed=s.seed))
    split = split_old_new(ds, seed=s.seed, max_hist=s.max_hist)
    users = sorted(set(split.old_interactions["user_id"].to_list()))
    prompts = list(encode_user_prompts(lm, split.old_interactions, ds, users, s.max_prompt_tokens).values())
    prompts += list(encode_item_prompts(lm, split.existing_items, ds.domain).values())
    return [(p, cache[prompt_key(p)]) for p in prompts if prompt_key(p) in cache and len(cache[prompt_key(p)]) > 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="smollm2-135m-redrafter")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--generated", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=600, help="seconds for the hidden-state forwards")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(args.threads)
    lm = laser.load_model(laser.DEFAULT_MODEL, device="cpu", dtype="float32")
    pairs = cached_pairs(lm, SuiteSettings())
    pairs.sort(key=lambda pa: len(pa[0]))  # short prompts first: more answers per second of forwards
    examples, t0 = [], time.perf_counter()
    for prompt, answer in pairs:
        if time.perf_counter() - t0 > args.budget_s:
            break
        f = extract_features(lm, [(prompt, answer)], 1, desc="cached answers")
        examples.append((prompt, answer, f.hidden[: len(answer) - 1].half()))
    logging.info(
        "%d of %d cached answers used (%.0f s of forwards)", len(examples), len(pairs), time.perf_counter() - t0
    )
    if args.generated:
        examples += generated_examples(args.generated)
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(0)).tolist()
    examples = [examples[i] for i in order]
    summary = fit_and_save(lm, examples, TrainSettings(steps=args.steps, checkpoint_every=25), args.name, args.workdir)
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}, indent=1))


if __name__ == "__main__":
    main()
