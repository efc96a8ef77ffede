"""`laser ingest feast`: a Feast feature repository over the knowledge feature tables, applied and materialized.

The repository (``<output>/feast/``) is plain Feast: ``feature_store.yaml`` (local provider, file registry,
SQLite online store, file offline store) and ``knowledge_repo.py`` (entities ``user`` and ``item``; feature
views ``user_knowledge`` and ``item_knowledge`` with the knowledge row's fields marked ``feature``
(``knowledge``, ``run_id``, ``source_hash``; their Feast types from their Arrow types) and
``knowledge_vector``; event timestamp = ``generated_at``; no TTL). ``feast apply`` / ``feast materialize-incremental``
work in it as well. :func:`ingest` applies the definitions and materializes: the first time from the
oldest row, then incrementally from the last materialized time to now. It runs under the output's run
lock, so a run cannot add rows that a concurrent materialization window would then skip.
"""

from __future__ import annotations

import json
import logging
import runpy
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.store.knowledge import KnowledgeRow, row_spec
from pipelines.ops.features.encode import ENTITY_TYPES, VECTOR, FeatureTables

log = logging.getLogger(__name__)

PROJECT = "laser_knowledge"
REPO_FILE = "knowledge_repo.py"

STORE_YAML = """\
project: {project}
provider: local
registry: {registry}
online_store:
  type: sqlite
  path: {online}
offline_store:
  type: file
entity_key_serialization_version: 3
"""

REPO_TEMPLATE = '''\
"""Feast definitions of the LASER knowledge features (written by `laser ingest feast`)."""
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Array, Bool, Float32, Float64, Int32, Int64, String, UnixTimestamp

VECTOR_DIM = {dim}  # encoder: {encoder}

user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.STRING,
              description="a recommender user")
item = Entity(name="item", join_keys=["item_id"], value_type=ValueType.STRING,
              description="a recommender item")


def _view(name, entity, path):
    source = FileSource(name=f"{{name}}_source", path=path, timestamp_field="event_timestamp")
    return FeatureView(
        name=name, entities=[entity], ttl=timedelta(0), source=source, online=True,
        schema=[{fields}],
        description="the newest LLM knowledge of each entity and its sentence vector")


user_knowledge = _view("user_knowledge", user, {user_path!r})
item_knowledge = _view("item_knowledge", item, {item_path!r})
'''


_FEAST_TYPES = {
    pa.string(): "String",
    pa.int32(): "Int32",
    pa.int64(): "Int64",
    pa.float32(): "Float32",
    pa.float64(): "Float64",
    pa.bool_(): "Bool",
}


def feast_dtype(arrow: pa.DataType) -> str:
    """The Feast type (its name in ``feast.types``) of a row column's Arrow type."""
    if pa.types.is_timestamp(arrow):
        return "UnixTimestamp"
    if arrow not in _FEAST_TYPES:
        raise ValueError(f"knowledge row feature of Arrow type {arrow}: no Feast type for it; add one to _FEAST_TYPES")
    return _FEAST_TYPES[arrow]


def feature_fields(row_type: type[KnowledgeRow]) -> str:
    """The feature views' ``schema`` entries: the row's fields marked ``feature``, then the vector."""
    spec = row_spec(row_type)
    fields = [f'Field(name="{n}", dtype={feast_dtype(spec.schema.field(n).type)})' for n in spec.features]
    return ", ".join([*fields, f'Field(name="{VECTOR}", dtype=Array(Float32))'])


@dataclass(frozen=True)
class FeastRepo:
    """A written repository: its folder and the definitions file."""

    path: Path

    @property
    def definitions(self) -> Path:
        return self.path / REPO_FILE

    def store(self) -> Any:
        from feast import FeatureStore

        return FeatureStore(repo_path=str(self.path))


def _yaml_str(value: object) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is valid YAML)."""
    return json.dumps(str(value))


def write_repo(output: str | Path, tables: FeatureTables, encoder: str) -> FeastRepo:
    """Write ``<output>/feast/{feature_store.yaml, knowledge_repo.py}`` (absolute paths inside)."""
    repo = Path(output).resolve() / "feast"
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(
        STORE_YAML.format(  # quoted: a path may hold '#', ': ' or spaces
            project=PROJECT,
            registry=_yaml_str(repo / "data" / "registry.db"),
            online=_yaml_str(repo / "data" / "online.db"),
        )
    )
    (repo / REPO_FILE).write_text(
        REPO_TEMPLATE.format(
            dim=tables.dim,
            encoder=encoder,
            fields=feature_fields(tables.row_type),
            user_path=str(tables.table("user").resolve()),
            item_path=str(tables.table("item").resolve()),
        )
    )
    return FeastRepo(repo)


def apply(repo: FeastRepo) -> Any:
    """``feast apply`` of the definitions file; returns the FeatureStore."""
    from feast import Entity, FeatureView

    defs = runpy.run_path(str(repo.definitions))
    objects = [o for o in defs.values() if isinstance(o, (Entity, FeatureView))]
    store = repo.store()
    store.apply(objects)
    return store


def _oldest_event(paths: list[Path]) -> datetime | None:
    times: list[datetime] = []
    for p in paths:
        col = pq.read_table(p, columns=["event_timestamp"]).column("event_timestamp")
        stamps = [t for t in col.to_pylist() if t is not None]  # never null: written from generated_at
        if stamps:
            times.append(min(stamps))
    return min(times) if times else None


def materialize(store: Any, tables: FeatureTables, end: datetime | None = None) -> dict[str, str]:
    """Into the online store: views never materialized from their oldest row, the others incrementally;
    returns {view: "full" | "incremental"}."""
    end = end or datetime.now(timezone.utc)
    done: dict[str, str] = {}
    for etype in ENTITY_TYPES:
        view = store.get_feature_view(f"{etype}_knowledge")
        if view.most_recent_end_time is None:
            oldest = _oldest_event([tables.table(etype)])
            if oldest is None:
                continue
            store.materialize(start_date=oldest - timedelta(seconds=1), end_date=end, feature_views=[view.name])
            done[view.name] = "full"
        else:
            store.materialize_incremental(end_date=end, feature_views=[view.name])
            done[view.name] = "incremental"
    log.info("feast: materialized %s", done)
    return done


def online_features(
    store: Any, entity_type: str, ids: list[str], features: tuple[str, ...] = ("knowledge", "knowledge_vector")
) -> dict[str, list[Any]]:
    """``get_online_features`` for ``ids``: {join key and each feature: values in order}."""
    view = f"{entity_type}_knowledge"
    resp = store.get_online_features(
        features=[f"{view}:{f}" for f in features], entity_rows=[{f"{entity_type}_id": i} for i in ids]
    )
    return resp.to_dict()


def ingest(
    output: str | Path, encoder: str = "all-minilm-l6-v2", row_type: type[KnowledgeRow] = KnowledgeRow
) -> tuple[FeastRepo, dict[str, str]]:
    """Encode the latest view, write and apply the repository, materialize (under the run lock); the features
    are ``row_type``'s fields marked ``feature``."""
    from pipelines.ops.features.encode import encode_latest
    from pipelines.store.lock import output_lock

    with output_lock(output, run_id="ingest-feast"):
        tables = encode_latest(output, encoder, row_type=row_type)
        repo = write_repo(output, tables, encoder)
        store = apply(repo)
        return repo, materialize(store, tables)
