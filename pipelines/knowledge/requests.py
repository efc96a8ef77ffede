"""The job's generation requests: one per user (history oldest first) and per item, each with its route
(the pool its decoder drafts from) and the hash of what its prompt is made of."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data import Dataset, Split
from pipelines.knowledge.generation import GenerationRequest
from pipelines.knowledge.prompts import PROMPT_VERSION, user_histories
from pipelines.knowledge.sources import source_hash
from pipelines.knowledge_store import done_keys
from pipelines.storage import Location
from pools.build import group_key

log = logging.getLogger(__name__)

Routes = dict[tuple[str, str], dict[str, Any]]


def user_requests(interactions: pl.DataFrame, items: pl.DataFrame, users: list[str] | None = None,
                  routes: Routes | None = None) -> list[GenerationRequest]:
    """One request per user with interactions (restricted to ``users`` when given), history oldest first."""
    histories = user_histories(interactions, items)
    wanted = sorted(histories) if users is None else sorted(users)
    return [_request("user", uid, routes, history=[tuple(e) for e in histories.get(uid, [])]) for uid in wanted]


def item_requests(items: pl.DataFrame, routes: Routes | None = None) -> list[GenerationRequest]:
    """One request per item row."""
    return [_request("item", row["item_id"], routes, item=row) for row in items.sort("item_id").iter_rows(named=True)]


def _request(entity_type: str, entity_id: str, routes: Routes | None, **payload: Any) -> GenerationRequest:
    route = (routes or {}).get((entity_type, entity_id))
    payload["source_hash"] = source_hash(entity_type, PROMPT_VERSION, payload.get("history", payload.get("item")))
    if route is None or route.get("pool_kind") is None:
        return GenerationRequest(entity_type, entity_id, **payload)
    key = group_key(entity_type, route["pool_kind"], route["group_id"])
    return GenerationRequest(entity_type, entity_id, pool_key=key, pool_kind=route["pool_kind"],
                             group_id=route["group_id"], **payload)


def old_requests(dataset: Dataset, split: Split) -> list[GenerationRequest]:
    """Old knowledge: every user with an old history and every existing item (no pool: greedy text)."""
    return user_requests(split.old_interactions, dataset.items) + item_requests(split.existing_items)


def new_requests(dataset: Dataset, split: Split, routes: Routes) -> list[GenerationRequest]:
    """New knowledge: users with new history (their prompt history: ``Split.prompt_interactions``) and new
    items."""
    new_users = split.new_interactions["user_id"].unique().to_list()
    return (user_requests(split.prompt_interactions, dataset.items, new_users, routes)
            + item_requests(split.new_items, routes))


def pool_routes(pool_need: str, routing: pl.DataFrame) -> Routes:
    """{(entity_type, entity_id): route} for a decoder's declared pool: ``routed`` (the entity's group
    pool), ``global`` (the type's global pool) or ``none``."""
    if pool_need == "none":
        return {}
    if pool_need == "global":
        return {(r["entity_type"], r["entity_id"]): {"pool_kind": "global", "group_id": "all"}
                for r in routing.select("entity_type", "entity_id").iter_rows(named=True)}
    return {(r["entity_type"], r["entity_id"]): r for r in routing.iter_rows(named=True)}


def pending(requests: list[GenerationRequest], store: Path | Location) -> list[GenerationRequest]:
    """The requests whose entity is not yet in ``store`` (resume)."""
    done = done_keys(store)
    left = [r for r in requests if (r.entity_type, r.entity_id) not in done]
    if len(left) < len(requests):
        log.info("%s: %d of %d entities already written, skipped", store, len(requests) - len(left), len(requests))
    return left
