"""Benchmark fixtures: prompts rendered to token ids, and "earlier knowledge" answered once by greedy
decoding and cached on disk.

The cache is content-addressed: one JSON file per (model, prompt version, generation budget) maps a
hash of each prompt's token ids (which encode the data: history, item attributes, truncation) to the
greedy answer. Any run that renders the same prompts, whatever the number of them, reuses the answers
and generates only the missing ones, so later runs start measuring at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import polars as pl
from filelock import FileLock
from tqdm import tqdm

import laser
from pipelines.data.schema import Dataset
from pipelines.knowledge.prompts import PROMPT_VERSION, item_prompt, user_histories, user_prompt

log = logging.getLogger(__name__)

FIXTURE_BATCH = 8  # prompts per batched greedy call (batching is several times faster on a CPU)


def default_cache_root() -> Path:
    """Where fixtures live: ``<laser cache dir>/bench``."""
    return laser.models.cache_dir() / "bench"


def prompt_key(ids: list[int]) -> str:
    """Content hash of a prompt's token ids."""
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:20]


def encode_user_prompts(
    lm: laser.LoadedModel, interactions: pl.DataFrame, ds: Dataset, users: list[str], max_prompt_tokens: int
) -> dict[str, list[int]]:
    """{user_id: chat-templated prompt ids} of the users' histories in ``interactions`` (oldest dropped to fit)."""
    encode = laser.get_decoder("autoregressive", lm).encode
    histories = user_histories(interactions.filter(pl.col("user_id").is_in(users)), ds.items)
    return {
        u: encode(
            user_prompt(histories[u], ds.domain, user_id=u, tokenizer=lm.tokenizer, max_prompt_tokens=max_prompt_tokens)
        )
        for u in users
        if u in histories
    }


def encode_item_prompts(lm: laser.LoadedModel, items: pl.DataFrame, domain: str) -> dict[str, list[int]]:
    """{item_id: chat-templated prompt ids} of item description prompts."""
    encode = laser.get_decoder("autoregressive", lm).encode
    return {row["item_id"]: encode(item_prompt(row, domain)) for row in items.iter_rows(named=True)}


def strip_eos(lm: laser.LoadedModel, ids: list[int]) -> list[int]:
    """Generated ids without a trailing end-of-sequence token (knowledge text as a pool stores it)."""
    return ids[:-1] if ids and ids[-1] in lm.eos_ids else ids


def greedy_knowledge(
    lm: laser.LoadedModel,
    prompts: Mapping[str, list[int]],
    max_new_tokens: int,
    cache_root: Path | None = None,
    batch_size: int = FIXTURE_BATCH,
    desc: str = "earlier knowledge",
) -> dict[str, list[int]]:
    """{entity: greedy answer ids (no EOS)} for ``prompts``; answers are cached on disk (module docstring)."""
    root = cache_root or default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(json.dumps([lm.name, PROMPT_VERSION, max_new_tokens]).encode()).hexdigest()[:16]
    path = root / f"greedy-{name}.json"
    keys = {entity: prompt_key(ids) for entity, ids in prompts.items()}
    with FileLock(str(path) + ".lock"):
        cached: dict[str, list[int]] = json.loads(path.read_text()) if path.exists() else {}
        todo = [e for e in prompts if keys[e] not in cached]
        if todo:
            log.info("Generating %d of %d %s greedily (cache %s)", len(todo), len(prompts), desc, path)
            decoder = laser.get_decoder("autoregressive", lm)
            for start in tqdm(range(0, len(todo), batch_size), desc=desc, unit="batch"):
                chunk = todo[start : start + batch_size]
                for entity, gen in zip(chunk, decoder.generate_batch([prompts[e] for e in chunk], max_new_tokens)):
                    cached[keys[entity]] = strip_eos(lm, gen.token_ids)
                _write_atomic(path, cached)  # after every batch: an interrupted run keeps what it made
    return {entity: cached[keys[entity]] for entity in prompts}


def _write_atomic(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)
