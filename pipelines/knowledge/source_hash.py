"""What a knowledge row was generated from: a stable hash of the prompt's inputs (staleness check)."""

from __future__ import annotations

import hashlib
import json


def source_hash(entity_type: str, prompt_version: str, payload: object) -> str:
    """sha256 (first 16 hex digits) of the entity's prompt inputs: a user's history (title, rating, ...
    oldest first) or an item's attribute row, plus the prompt version. Equal inputs give equal hashes
    across processes and runs; any edit (a rating 4 -> 1, a new interaction, a retitled item) changes it."""
    blob = json.dumps([entity_type, prompt_version, payload], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
