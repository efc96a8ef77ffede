"""What decided a knowledge row's text besides its inputs: a hash of the generation config.

Each row stores ``config_hash`` (this) beside ``source_hash`` (its inputs: pipelines/knowledge/source_hash.py).
A run regenerates an entity whose newest row differs in either, so a changed model, decoder, decoder
parameter, generation rule, limit or prompt version never leaves rows of another config in place
silently (``--keep-existing`` keeps them and says how many). Where the actors run (engine, workers,
threads) and where the output goes are not part of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

# DecodeTask fields that do not shape the text: provenance, pool locations and caches, what grounding counts
_NOT_TEXT = (  # prompts: prompt_version
    "run_id",
    "pool_store",
    "pool_cache_size",
    "online_pools",
    "pool_max_size",
    "config_hash",
    "prompts",
    "brands",
)


def generation_hash(model: str, dtype: str, task_fields: Mapping[str, object]) -> str:
    """sha256 (first 16 hex digits) of the model, its dtype and a decode task's text-shaping fields."""
    shaping = {k: v for k, v in task_fields.items() if k not in _NOT_TEXT}
    blob = json.dumps({"model": model, "dtype": dtype, **shaping}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
