"""Per-entity sampling settings: the job's ``generation`` sampling block with a seed of each entity's own.

The seed is a stable hash of the job's sampling seed, the entity type and the entity id, so an entity
draws the same tokens whatever batch it lands in, in a resumed run as in a fresh one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

from laser.sampling import GREEDY, SamplingParams


def entity_seed(seed: int, entity_type: str, entity_id: str) -> int:
    """A 63-bit seed derived from the job seed and the entity (stable across runs and machines)."""
    digest = hashlib.sha256(f"{seed}\0{entity_type}\0{entity_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def entity_sampling(settings: Mapping[str, float] | None, entity_type: str, entity_id: str) -> SamplingParams:
    """The sampling settings of one entity (greedy when ``settings`` is None or its temperature is 0)."""
    if not settings or not settings.get("temperature"):
        return GREEDY
    return SamplingParams(
        temperature=float(settings["temperature"]),
        top_p=float(settings.get("top_p", 1.0)),
        top_k=int(settings.get("top_k", 0)),
        seed=entity_seed(int(settings.get("seed", 0)), entity_type, entity_id),
    )


def encode_sampling(sampling: SamplingParams) -> str:
    """The ``sampling`` column of a knowledge row: JSON, keys sorted (temperature 0 = greedy)."""
    return json.dumps(sampling.as_dict(), sort_keys=True, separators=(",", ":"))
