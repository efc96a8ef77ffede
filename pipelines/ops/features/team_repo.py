"""`laser ingest feast --repo DIR`: the knowledge features into a team's own Feast repository, whatever its
online store (Redis, Postgres, DynamoDB, SQLite, ...).

The team's ``feature_store.yaml`` decides where features live; this module only registers the knowledge
definitions in its registry and pushes rows:

- entities ``user`` and ``item`` (join keys ``user_id``, ``item_id``): the repository's own when it has them
  (a different join key is an error naming it), else created;
- feature views ``user_knowledge`` and ``item_knowledge``, their schema from the knowledge row's fields marked
  ``feature`` plus ``knowledge_vector``, each fed by a ``PushSource`` (``<view>_push``) whose batch source is
  the encoded feature table (``<output>/features/<type>_knowledge.parquet``); applied again on every ingest
  (a new row field or encoder updates them);
- rows pushed with Feast's push API to the online store (``PushMode.ONLINE``): on the first ingest every
  entity of the latest view, then only the rows newer than the last push (``features/feast_pushed.json``
  remembers, per repository and view, the newest ``event_timestamp`` pushed).

Runs under the output's lock, as the demo repository's ingestion (:mod:`pipelines.ops.features.feast_repo`).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.store.knowledge import KnowledgeRow, row_spec
from pipelines.ops.features.encode import ENTITY_TYPES, VECTOR, FeatureTables
from pipelines.ops.features.feast_repo import feast_dtype
from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)

PUSHED_FILE = "feast_pushed.json"
PUSH_ROWS = 50_000  # rows read and pushed at a time


class RepoError(ValueError):
    """A team repository the knowledge features cannot go into; the message names the repository."""


def _entity(store: Any, entity_type: str) -> Any:
    """The repository's entity of ``entity_type``, or a new one; its join key must be ``<type>_id``."""
    from feast import Entity, ValueType

    key = f"{entity_type}_id"
    try:
        found = store.get_entity(entity_type)
    except Exception:  # noqa: BLE001 - Feast raises its own not-found errors per registry kind
        return Entity(
            name=entity_type, join_keys=[key], value_type=ValueType.STRING, description=f"a recommender {entity_type}"
        )
    if found.join_key != key:
        raise RepoError(
            f"{store.repo_path}: entity {entity_type!r} joins on {found.join_key!r}, the knowledge features on "
            f"{key!r}; rename one of them"
        )
    return found


def knowledge_objects(store: Any, tables: FeatureTables) -> list[Any]:
    """The entities, push sources and feature views of the knowledge features, for ``store.apply``."""
    from feast import FeatureView, Field, FileSource, PushSource
    from feast import types as ft

    spec = row_spec(tables.row_type)
    schema = [Field(name=n, dtype=getattr(ft, feast_dtype(spec.schema.field(n).type))) for n in spec.features]
    schema.append(Field(name=VECTOR, dtype=ft.Array(ft.Float32)))
    objects: list[Any] = []
    for etype in ENTITY_TYPES:
        entity, view = _entity(store, etype), f"{etype}_knowledge"
        batch = FileSource(
            name=f"{view}_batch", path=str(tables.table(etype).resolve()), timestamp_field="event_timestamp"
        )
        push = PushSource(name=f"{view}_push", batch_source=batch)
        objects += [
            entity,
            push,
            FeatureView(
                name=view,
                entities=[entity],
                ttl=timedelta(0),
                source=push,
                online=True,
                schema=list(schema),
                description="the newest LLM knowledge of each entity and its sentence vector (laser)",
            ),
        ]
    return objects


def _pushed(tables: FeatureTables) -> dict[str, dict[str, str]]:
    path = tables.root / PUSHED_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def push_new_rows(store: Any, tables: FeatureTables, repo: str) -> dict[str, int]:
    """Push each view's rows newer than the last push into ``repo`` to the online store, ``PUSH_ROWS`` at a time
    (memory bounded whatever the catalogue); returns rows per view. The mark moves once a view is pushed whole:
    a push that breaks off is repeated by the next ingest (the online store keeps the newest value per key)."""
    from feast.data_source import PushMode

    marks, pushed = _pushed(tables), {}
    mine = marks.setdefault(repo, {})
    for etype in ENTITY_TYPES:
        view, path = f"{etype}_knowledge", tables.table(etype)
        if not path.exists():
            continue
        since, newest, pushed[view] = mine.get(view), None, 0
        for batch in pq.ParquetFile(path).iter_batches(PUSH_ROWS):
            stamps = batch.column("event_timestamp")
            if since is not None:
                batch = batch.filter(pc.greater(stamps, pa.scalar(datetime.fromisoformat(since), stamps.type)))
            if batch.num_rows:
                store.push(f"{view}_push", batch.to_pandas(), to=PushMode.ONLINE)
                top = pc.max(batch.column("event_timestamp")).as_py()
                newest, pushed[view] = max(newest or top, top), pushed[view] + batch.num_rows
        if newest is not None:
            mine[view] = newest.isoformat()
    atomic_write_local(tables.root / PUSHED_FILE, lambda tmp: Path(tmp).write_text(json.dumps(marks, indent=1)))
    log.info("feast: pushed %s into %s", pushed, repo)
    return pushed


def ingest_into(
    repo_dir: str | Path,
    output: str | Path,
    encoder: str = "all-minilm-l6-v2",
    row_type: type[KnowledgeRow] = KnowledgeRow,
) -> dict[str, int]:
    """Encode the latest view, register the knowledge definitions in the team's repository at ``repo_dir``
    and push the new rows to its online store (under the output's lock); returns rows pushed per view."""
    from feast import FeatureStore

    from pipelines.store.lock import output_lock
    from pipelines.ops.features.encode import encode_latest

    repo = Path(repo_dir).resolve()
    if not (repo / "feature_store.yaml").is_file():
        raise RepoError(f"{repo}: no feature_store.yaml; --repo names a Feast repository (feast init makes one)")
    with output_lock(output, run_id="ingest-feast"):
        tables = encode_latest(output, encoder, row_type=row_type)
        store = FeatureStore(repo_path=str(repo))
        store.apply(knowledge_objects(store, tables))
        return push_new_rows(store, tables, str(repo))
