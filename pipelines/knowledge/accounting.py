"""Entities that get no knowledge, counted by reason, so that none disappears silently.

Users are served when they have interactions (every user with one has a new history, see
``pipelines/data/split.py``); items always are (existing items get old knowledge, new items new
knowledge). A user in the users table without any interaction (e.g. every one of its interactions was
outside a trial sample) gets none: counted here, logged, and written to the closing summary.
"""

from __future__ import annotations

import logging
from typing import Mapping

import polars as pl

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


def lightgcn_notes(best_recall: float | None) -> dict[str, str]:
    """A warning note when LightGCN learned nothing (best recall@k 0, or not trained): collaborative groups
    are then arbitrary. Logged; the job writes it to the closing summary."""
    if best_recall is None:
        msg = "LightGCN was not trained; collaborative groups are unavailable"
    elif best_recall <= 0.0:
        msg = (
            "LightGCN learned nothing (best recall@k 0.0): collaborative groups are arbitrary; the sample is "
            "probably too small (raise dataset.limit_users / limit_items)"
        )
    else:
        return {}
    log.warning(msg)
    return {"warning_lightgcn": msg}


def pool_kind_notes(routing: pl.DataFrame, policies: Mapping[str, str]) -> dict[str, str]:
    """A warning note per entity type routed ``warm_cold`` whose entities all went to one pool kind (the
    binary router then routes nothing). ``routing``: entity_type, pool_kind columns."""
    out = {}
    for etype, policy in policies.items():
        if policy != "warm_cold":
            continue
        kinds = routing.filter(pl.col("entity_type") == etype)["pool_kind"].unique().to_list()
        if len(kinds) == 1:
            msg = (
                f"every {etype} went to the {kinds[0]} pool (routing.{etype}_policy warm_cold, warm_threshold); "
                "the router had nothing to choose"
            )
            log.warning(msg)
            out[f"warning_{etype}_pools"] = msg
    return out
