"""The job's generation requests: one per user (history oldest first) and per item, each with its route
(the pool its decoder drafts from) and the hash of what its prompt is made of."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.data import Dataset, Split
from pipelines.store.frames import as_frame
from pipelines.knowledge.prompts import PROMPT_VERSION, ItemRow, user_histories
from pipelines.knowledge.source_hash import source_hash
from pipelines.store.shards import done_keys
from pipelines.store.location import Location, atomic_write_local
from pipelines.workers import GenerationRequest, HistoryEntry
from pools.build import group_key

log = logging.getLogger(__name__)

Routes = dict[tuple[str, str], dict[str, str | None]]  # (type, id) -> pool_kind, group_id


def user_requests(
    interactions: pl.DataFrame, items: pl.DataFrame, users: list[str] | None = None, routes: Routes | None = None
) -> list[GenerationRequest]:
    """One request per user with interactions (restricted to ``users`` when given), history oldest first."""
    histories = user_histories(interactions, items)
    wanted = sorted(histories) if users is None else sorted(users)
    return [_request("user", uid, routes, history=list(histories.get(uid, []))) for uid in wanted]


def item_requests(items: pl.DataFrame, routes: Routes | None = None) -> list[GenerationRequest]:
    """One request per item row."""
    return [_request("item", row["item_id"], routes, item=row) for row in items.sort("item_id").iter_rows(named=True)]


def _request(
    entity_type: str,
    entity_id: str,
    routes: Routes | None,
    history: list[HistoryEntry] | None = None,
    item: ItemRow | None = None,
    source_hash: str | None = None,
) -> GenerationRequest:
    """A request with its route (none: no pool) and the source hash of its payload unless given."""
    if source_hash is None:
        source_hash = payload_hash(entity_type, history if history is not None else item)
    req = GenerationRequest(
        entity_type, entity_id, history=history, item=dict(item) if item is not None else None, source_hash=source_hash
    )
    route = (routes or {}).get((entity_type, entity_id))
    kind = route.get("pool_kind") if route else None
    if route is None or kind is None:
        return req
    group = route["group_id"] or ""
    req.pool_key, req.pool_kind, req.group_id = group_key(entity_type, kind, group), kind, route["group_id"]
    return req


def payload_hash(entity_type: str, payload: object) -> str:
    """The source hash of a request's payload: a user's history (list) or an item's row (dict)."""
    if isinstance(payload, (list, tuple)):
        payload = [_hashed(e) for e in payload]
    return source_hash(entity_type, PROMPT_VERSION, payload)


def _hashed(entry: object) -> object:
    """A history entry as its hash reads it: an explicit one (no event, no weight) as its first three fields,
    so explicit hashes stay what they were before implicit feedback; an implicit one whole."""
    if isinstance(entry, HistoryEntry) and entry.event is None and entry.weight is None:
        return tuple(entry[:3])
    return entry


def old_requests(dataset: Dataset, split: Split) -> list[GenerationRequest]:
    """Old knowledge: every user with an old history and every existing item (no pool: greedy text)."""
    return user_requests(split.old_interactions, dataset.items) + item_requests(split.existing_items)


def new_requests(
    dataset: Dataset, split: Split, routes: Routes, only: pl.DataFrame | None = None
) -> list[GenerationRequest]:
    """New knowledge: users with new history (their prompt history: ``Split.prompt_interactions``) and new
    items; ``only`` (entity_type, entity_id): those entities alone (the ones a run plans to generate)."""
    users, items = _new_users(split), split.new_items["item_id"].sort()
    if only is not None:
        users = users.filter(users.is_in(_ids(only, "user").implode()))
        items = items.filter(items.is_in(_ids(only, "item").implode()))
    histories, rows = _prompt_inputs(dataset, split, users, items)
    reqs = [_request("user", u, routes, history=histories.get(u, [])) for u in users]
    _attach_users(dataset, reqs)
    return reqs + [_request("item", i, routes, item=rows[i]) for i in items]


def _attach_users(dataset: Dataset, requests: list[GenerationRequest]) -> None:
    """Each user request's attribute columns (``req.user``: what a prompt template may show), when the users
    table has any. They are not part of the source hash: a changed attribute alone regenerates nothing."""
    users = dataset.users
    wanted = [r for r in requests if r.entity_type == "user"]
    if len(users.columns) < 2 or not wanted:
        return
    ids = pl.Series([r.entity_id for r in wanted], dtype=pl.Utf8)
    rows = {
        row.pop("user_id"): row for row in users.filter(pl.col("user_id").is_in(ids.implode())).iter_rows(named=True)
    }
    absent = dict.fromkeys(c for c in users.columns if c != "user_id")  # a user the table lacks: nulls
    for req in wanted:
        req.user = rows.get(req.entity_id, absent)


def _ids(keys: pl.DataFrame, entity_type: str) -> pl.Series:
    return keys.filter(pl.col("entity_type") == entity_type)["entity_id"]


def _prompt_inputs(
    dataset: Dataset, split: Split, users: pl.Series, items: pl.Series
) -> tuple[dict[str, list[HistoryEntry]], dict[str, ItemRow]]:
    """What the prompts of ``users`` and ``items`` are made of: histories (``Split.prompt_interactions``, oldest
    first) by user id, item rows by item id."""
    interactions = split.prompt_interactions.filter(pl.col("user_id").is_in(users.implode()))
    rows = split.new_items.filter(pl.col("item_id").is_in(items.implode())).iter_rows(named=True)
    return user_histories(interactions, dataset.items), {row["item_id"]: row for row in rows}


def planned_requests(keys: pl.DataFrame, routes: Routes) -> list[GenerationRequest]:
    """Requests of ``keys`` (entity_type, entity_id, source_hash) with their route and hash but no payload (a
    few hundred bytes each, the history left out): :func:`attach_payloads` fills them batch by batch."""
    return [
        _request(t, i, routes, source_hash=h)
        for t, i, h in keys.select("entity_type", "entity_id", "source_hash").iter_rows()
    ]


def attach_payloads(dataset: Dataset, split: Split, requests: list[GenerationRequest]) -> None:
    """Fill in each request's prompt inputs: a user's history or an item's row (those :func:`new_requests`
    gives)."""
    ids = {t: pl.Series([r.entity_id for r in requests if r.entity_type == t], dtype=pl.Utf8) for t in ("user", "item")}
    histories, rows = _prompt_inputs(dataset, split, ids["user"], ids["item"])
    for req in requests:
        if req.entity_type == "user":
            req.history = histories.get(req.entity_id, [])
        else:
            req.item = dict(rows[req.entity_id])
    _attach_users(dataset, requests)


def drop_payloads(requests: list[GenerationRequest]) -> None:
    """Forget the prompt inputs of requests that were decoded (the driver holds a batch's at a time)."""
    for req in requests:
        req.history = req.item = req.user = None


def _new_users(split: Split) -> pl.Series:
    return split.new_interactions["user_id"].unique().sort()


# ---- every entity's source hash, computed only where its inputs changed ------------------------------

SOURCE_CACHE = "source-hashes.parquet"  # in the job's work folder
KEY_SCHEMA = {"entity_type": pl.Utf8, "entity_id": pl.Utf8, "source_hash": pl.Utf8}


def fingerprints(dataset: Dataset, split: Split) -> pl.DataFrame:
    """(entity_type, entity_id, fingerprint) of every entity :func:`new_requests` covers: a columnar hash of
    exactly what its prompt is made of (a user's history rows in order, joined with their items' title, year
    and genres; an item's row). Equal within one polars version; a different fingerprint means "recompute"."""
    items, users = dataset.items, _new_users(split)
    extra = [c for c in ("title", "year", "genres") if c in items.columns]
    feedback = [c for c in ("weight", "event") if c in split.prompt_interactions.columns]  # implicit only
    rows = (
        split.prompt_interactions.filter(pl.col("user_id").is_in(users.implode()))
        .sort(["user_id", "timestamp", "item_id"])
        .join(items.select("item_id", *extra), on="item_id", how="left", maintain_order="left")
    )
    per_user = (
        rows.group_by("user_id", maintain_order=True)
        .agg(fingerprint=pl.struct("item_id", "rating", *extra, *feedback).hash(0))
        .with_columns(pl.col("fingerprint").hash(1))
    )
    user_fp = (
        pl.DataFrame({"user_id": users})
        .join(per_user, on="user_id", how="left")
        .select(entity_type=pl.lit("user"), entity_id="user_id", fingerprint=pl.col("fingerprint").fill_null(0))
    )
    item_fp = split.new_items.select(
        entity_type=pl.lit("item"), entity_id="item_id", fingerprint=pl.struct(pl.all()).hash(0)
    )
    return pl.concat([user_fp, item_fp])


def request_keys(dataset: Dataset, split: Split, cache: Path | None = None, write: bool = True) -> pl.DataFrame:
    """(entity_type, entity_id, source_hash) of every entity :func:`new_requests` covers, without a request
    object each: the hash is taken from ``cache`` (the last run's fingerprints and hashes) where the
    entity's :func:`fingerprints` did not change, and computed (``payload_hash``) for the rest;
    the cache is rewritten with ``write``."""
    fp = fingerprints(dataset, split)
    known = _read_cache(cache)
    keys = (
        fp.join(known, on=["entity_type", "entity_id", "fingerprint"], how="left")
        if known is not None
        else fp.with_columns(source_hash=pl.lit(None, pl.Utf8))
    )
    missing = keys.filter(pl.col("source_hash").is_null())
    if missing.height:
        log.info("source hashes: %d of %d entities' inputs changed or are new", missing.height, keys.height)
        exact = _exact_hashes(dataset, split, missing)
        keys = (
            keys.join(exact, on=["entity_type", "entity_id"], how="left", suffix="_exact")
            .with_columns(source_hash=pl.coalesce("source_hash", "source_hash_exact"))
            .drop("source_hash_exact")
        )
    if cache is not None and write:
        _write_cache(cache, keys)
    return keys.drop("fingerprint")


def _exact_hashes(dataset: Dataset, split: Split, keys: pl.DataFrame) -> pl.DataFrame:
    """The source hashes of ``keys``' entities, as their requests compute them (no request objects)."""
    users, items = _ids(keys, "user"), _ids(keys, "item")
    histories, rows = _prompt_inputs(dataset, split, users, items)
    hashes = [("user", u, payload_hash("user", histories.get(u, []))) for u in users]
    hashes += [("item", i, payload_hash("item", rows[i])) for i in items]
    return pl.DataFrame(hashes, schema=KEY_SCHEMA, orient="row")


def _cache_meta() -> dict[bytes, bytes]:
    return {b"polars": pl.__version__.encode(), b"prompt_version": PROMPT_VERSION.encode()}


def _read_cache(cache: Path | None) -> pl.DataFrame | None:
    """The last run's (entity, fingerprint, source_hash) rows, when written by this polars and prompt version."""
    if cache is None or not cache.exists():
        return None
    try:
        table = pq.read_table(cache)
    except (OSError, pa.ArrowException) as exc:
        log.warning("%s: unreadable (%s); every source hash is computed again", cache, exc)
        return None
    if (table.schema.metadata or {}) != _cache_meta():  # another polars hashes otherwise: recompute all
        return None
    return as_frame(table)


def _write_cache(cache: Path, keys: pl.DataFrame) -> None:
    table = keys.select("entity_type", "entity_id", "fingerprint", "source_hash").to_arrow()
    atomic_write_local(cache, lambda tmp: pq.write_table(table.replace_schema_metadata(_cache_meta()), tmp))


def pool_routes(pool_need: str, routing: pl.DataFrame) -> Routes:
    """{(entity_type, entity_id): route} for a decoder's declared pool: ``routed`` (the entity's group
    pool), ``global`` (the type's global pool) or ``none``."""
    if pool_need == "none":
        return {}
    if pool_need == "global":
        return {
            (r["entity_type"], r["entity_id"]): {"pool_kind": "global", "group_id": "all"}
            for r in routing.select("entity_type", "entity_id").iter_rows(named=True)
        }
    return {(r["entity_type"], r["entity_id"]): r for r in routing.iter_rows(named=True)}


def pending(requests: list[GenerationRequest], store: Path | Location) -> list[GenerationRequest]:
    """The requests whose entity is not yet in ``store`` (resume)."""
    done = done_keys(store)
    left = [r for r in requests if (r.entity_type, r.entity_id) not in done]
    if len(left) < len(requests):
        log.info("%s: %d of %d entities already written, skipped", store, len(requests) - len(left), len(requests))
    return left
