"""Entities that get no knowledge, counted by reason, so that none disappears silently.

Users are served when they have interactions (every user with one has a new history, see
``pipelines/data/split.py``); items always are (existing items get old knowledge, new items new
knowledge). A user in the users table without any interaction (e.g. every one of its interactions was
outside a trial sample) gets none: counted here, logged, and written to the closing summary.
"""
from __future__ import annotations

import logging

from pipelines.data import Dataset, Split

log = logging.getLogger(__name__)

NO_INTERACTIONS = "users without interactions"
NO_NEW_HISTORY = "users without new history (old knowledge only)"


def skipped_entities(ds: Dataset, split: Split) -> dict[str, int]:
    """{reason: count} of entities that get no (new) knowledge; logged when any."""
    users = set(ds.users["user_id"])
    active = set(ds.interactions["user_id"])
    with_new = set(split.new_interactions["user_id"])
    skipped = {NO_INTERACTIONS: len(users - active), NO_NEW_HISTORY: len(active - with_new)}
    for reason, n in skipped.items():
        if n:
            example = sorted((users - active) if reason == NO_INTERACTIONS else (active - with_new))[:5]
            log.warning("%d %s get no new knowledge (e.g. %s)", n, reason, example)
    return {k: v for k, v in skipped.items() if v}
