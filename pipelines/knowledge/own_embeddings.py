"""A team's own user/item vectors (``routing.embeddings``): read, matched to the data's entities, and
fingerprinted so that an incremental run routes afresh when the files change.

The files are read as ``dataset.path`` is (pipelines/data/table_files.py): one Parquet file, a folder, a glob or
an fsspec URI. Entities without a vector get no collaborative group: the router sends them to their attribute
pool, as cold ones, and a counted note says how many. A file none of whose ids is an entity of the data is an
error naming it (usually the wrong id column or the other entity type's file).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

import polars as pl

from pipelines.config import EmbeddingsConfig, JobConfig
from pipelines.data.table_files import TableSource, columns_of, locate, read_parquet
from pipelines.knowledge.inputs import JobData

if TYPE_CHECKING:  # router (torch) is imported when vectors are read, not with this module
    from router import Embeddings

log = logging.getLogger(__name__)

_ROW = "__row"  # read_parquet's row-number column (dropped)
_STAMPS = ("ETag", "etag", "mtime", "LastModified", "last_modified", "created", "md5")  # what fsspec's info() offers


def _sources(cfg: EmbeddingsConfig) -> dict[str, TableSource]:
    """Entity type -> the files of its vectors (a type without a path is absent)."""
    paths = {"user": cfg.users, "item": cfg.items}
    return {etype: locate(path, key=f"routing.embeddings.{etype}s") for etype, path in paths.items() if path}


def _read(src: TableSource, cfg: EmbeddingsConfig) -> Embeddings:
    from router.embeddings import embeddings_from_frame

    present = set(columns_of(src))
    wanted = [c for c in (cfg.id_column, cfg.vector_column) if c in present]
    frame = read_parquet(src, wanted or None, _ROW).drop(_ROW)
    return embeddings_from_frame(frame, str(src.label), cfg.id_column, cfg.vector_column)


def _matched(etype: str, emb: Embeddings, label: str, entities: list[str]) -> tuple[Embeddings, list[str]]:
    """The vectors of ``entities`` (extra ids dropped) and the entities without one."""
    from router import EmbeddingError

    known = set(emb.ids)
    keep = [e for e in entities if e in known]
    if not keep:
        raise EmbeddingError(
            f"{label}: none of its {len(emb)} ids (e.g. {emb.ids[:3]}) is a {etype} of the data "
            f"(e.g. {entities[:3]}); check the file and routing.embeddings.id_column"
        )
    extra = len(emb) - len(keep)
    if extra:
        log.info("%s: %d ids are no %s of the data (ignored)", label, extra, etype)
    return emb.subset(keep), [e for e in entities if e not in known]


def own_vectors(cfg: JobConfig, data: JobData) -> dict[str, Embeddings | None]:
    """Per entity type, the team's vectors of the data's users and items (None: no file for that type);
    entities without a vector are counted in ``data.dataset.notes`` (``<type>s_without_embedding``)."""
    ec = cfg.routing.embeddings
    assert ec is not None
    entities = {"user": data.dataset.users["user_id"], "item": data.dataset.items["item_id"]}
    out: dict[str, Embeddings | None] = {"user": None, "item": None}
    for etype, src in _sources(ec).items():
        vectors, missing = _matched(etype, _read(src, ec), str(src.label), entities[etype].cast(pl.Utf8).to_list())
        out[etype] = vectors
        if missing:
            note = {"count": len(missing), "first": missing[:5], "file": str(src.label)}
            data.dataset.notes[f"{etype}s_without_embedding"] = note
            log.warning(
                "%d of %d %ss have no vector in %s (e.g. %s): routed to their attribute pool, as cold",
                len(missing),
                len(missing) + len(vectors),
                etype,
                src.label,
                missing[:5],
            )
        log.info(
            "routing: %d %s vectors (dim %d) from %s; LightGCN not trained", len(vectors), etype, vectors.dim, src.label
        )
    return out


def _stamp(info: dict[str, Any]) -> str:
    return next((str(info[k]) for k in _STAMPS if info.get(k) is not None), "")


def fingerprint(cfg: JobConfig) -> str | None:
    """What the routing was learned from besides the interactions: None with LightGCN, else a hash of the
    embeddings settings and each file's path, size and modification stamp (mtime; ETag on object stores)."""
    ec = cfg.routing.embeddings
    if ec is None:
        return None
    files = {
        etype: [(f, int(src.fs.size(f) or 0), _stamp(src.fs.info(f))) for f in src.files]
        for etype, src in _sources(ec).items()
    }
    text = json.dumps({"settings": ec.model_dump(), "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
