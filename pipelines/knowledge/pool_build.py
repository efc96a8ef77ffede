"""Step 3 of the knowledge job: one retrieval pool per group from its members' earlier knowledge, persisted.

The driver only selects (Arrow columns: which entity's text goes in which pool, capped by a seeded hash) and
compares with the store's last build; the pools that changed are cut into parts of about equal size, and each
part is tokenised and written by a Ray task on any node of the cluster (``pools.store.write_part``). The tries
themselves are built where they are used: by the worker that first drafts from a pool (or here, with
``routing.pool_snapshots``). A pool whose texts changed by at most ``routing.pool_refresh_share`` is kept.
A build of one part with no cluster configured is done in this process (the same functions).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, cast

import polars as pl
import pyarrow as pa

from pipelines.config import JobConfig
from pipelines.store.frames import as_frame
from pipelines.knowledge.paths import JobPaths
from pipelines.store.knowledge import read_knowledge
from pipelines.workers.tasks import map_tasks

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pools.build import PoolBuildConfig
    from pools.store import PoolStore, TokenizerFingerprint

PartEntry = dict[str, object]  # a pool's entry in the pool store's manifest (pools.store.write_part)

log = logging.getLogger(__name__)

PART_TEXTS = 50_000  # texts a build task tokenises and writes (about 25 MB of token ids)


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """The tokenizer of the job's model (pool texts must be tokenised exactly as the actors decode)."""
    import laser

    return laser.load_tokenizer(model)


def build_settings(cfg: JobConfig, pool_need: str) -> PoolBuildConfig:
    """What the pools hold for decoders that draft from ``pool_need`` pools: routed, global or both."""
    from pools.build import PoolBuildConfig

    rc = cfg.routing
    return PoolBuildConfig(
        max_pool_size=rc.max_pool_size,
        global_max_size=rc.global_pool_size,
        with_groups=pool_need != "global",
        with_global=pool_need != "routed",
        on_missing="skip",
        seed=rc.seed,
    )


def step_build_pools(
    cfg: JobConfig, knowledge: pa.Table | None = None, directory: Path | None = None, pool_need: str = "routed"
) -> dict[str, int]:
    """Step 3: the pools of ``pool_need`` (``routed``: one per group; ``global``: one per entity type; ``both``) from the
    members' knowledge (default: the old-knowledge store; ``knowledge``: entity_type, entity_id, knowledge),
    persisted in ``directory`` (default: the job's pool store); returns {pool key: texts}."""
    import router
    from pools.build import member_hashes, select_texts
    from pools.store import TokenizerFingerprint, commit_store

    paths = JobPaths.of(cfg)
    if not paths.memberships.exists():
        raise FileNotFoundError(f"{paths.memberships}: no group memberships; run `laser route` first")
    if knowledge is None:
        knowledge = read_knowledge(paths.old_knowledge).select("entity_type", "entity_id", "knowledge").to_arrow()
    directory = directory or paths.pools
    tokenizer = load_tokenizer(cfg.model.name)
    fingerprint, build = TokenizerFingerprint.of(tokenizer), build_settings(cfg, pool_need)
    selection = select_texts(
        knowledge.select(["entity_type", "entity_id", "knowledge"]), router.read_routing(paths.memberships), build
    )
    _log_skipped(selection.skipped)
    members, meta = member_hashes(selection), _meta(cfg, build)
    kept = _reusable(directory, fingerprint, meta, members, cfg.routing.pool_refresh_share)
    todo = selection.frame.filter(~pl.col("pool_key").is_in(list(kept)))
    sizes = selection.sizes()
    log.info(
        "pools: %d pools from %d knowledge texts: %d kept from the last build, %d to write (%d texts)",
        len(sizes),
        knowledge.num_rows,
        len(kept),
        todo["pool_key"].n_unique(),
        todo.height,
    )
    written = _write_parts(cfg, todo, selection.column, tokenizer, directory)
    commit_store(
        directory, {**kept, **written}, fingerprint, {**meta, "run_id": cfg.resolved_run_id()}, members.to_arrow()
    )
    return sizes


def _meta(cfg: JobConfig, build: PoolBuildConfig) -> dict[str, object]:
    """What a build's pools depend on besides their texts: a store built otherwise is not reused."""
    settings = {
        k: getattr(build, k) for k in ("max_pool_size", "global_max_size", "with_groups", "with_global", "seed")
    }
    return {
        "model": cfg.model.name,
        "build": settings,
        "polars": pl.__version__,
        "snapshots": cfg.routing.pool_snapshots,
    }


def _log_skipped(skipped: list[tuple[str, str, str]]) -> None:
    if skipped:
        shown = "; ".join(f"{t} {e}: {why}" for t, e, why in skipped[:5])
        log.warning("pools: %d knowledge rows skipped: %s%s", len(skipped), shown, " ..." if len(skipped) > 5 else "")


def _reusable(
    directory: Path,
    fingerprint: TokenizerFingerprint,
    meta: dict[str, object],
    members: pl.DataFrame,
    refresh_share: float,
) -> dict[str, PartEntry]:
    """The entries of the store's last build that this build keeps: same tokenizer and settings, texts changed
    by at most ``refresh_share``, files whole."""
    from pools.build import stale_pools
    from pools.store import PoolStore, PoolStoreError

    try:
        store = PoolStore.open(directory, tokenizer=fingerprint)
        previous = store.members()
    except (PoolStoreError, OSError, ValueError) as exc:
        if (directory / "manifest.json").exists():
            log.info("pools: the last build is not reused (%s)", exc)
        return {}
    if previous is None or {k: store.manifest["meta"].get(k) for k in meta} != meta:
        return {}
    stale = stale_pools(as_frame(previous), members, refresh_share)
    wanted = set(members["pool_key"].unique())
    keep = {k: e for k, e in store.manifest["pools"].items() if k not in stale and k in wanted}
    return {k: e for k, e in keep.items() if _whole(store, k)}


def _whole(store: PoolStore, key: str) -> bool:
    """A kept pool's part file still matches its checksum (a corrupt one is written again)."""
    from pools.store import PoolStoreError

    try:
        store.check(key)
        return True
    except (PoolStoreError, OSError) as exc:
        log.warning("pools: %s is written again: %s", key, exc)
        return False


def _parts(todo: pl.DataFrame, n_parts: int) -> list[pl.DataFrame]:
    """``todo`` (sorted by pool) cut into about ``n_parts`` runs of whole pools of about equal size."""
    if todo.height == 0:
        return []
    size = math.ceil(todo.height / n_parts)
    pools = todo.group_by("pool_key", maintain_order=True).len()
    part = ((pl.col("len").cum_sum() - 1) // size).alias("part")
    lengths = pools.group_by(part, maintain_order=True).agg(pl.col("len").sum())["len"]
    return [todo.slice(offset, length) for offset, length in zip(lengths.cum_sum() - lengths, lengths)]


def _write_parts(
    cfg: JobConfig, todo: pl.DataFrame, column: str, tokenizer: PreTrainedTokenizerBase, directory: Path
) -> dict[str, PartEntry]:
    """Each part tokenised and written by a Ray task; in this process when the work is one part and no cluster
    is configured (a task would only add a worker process's start on this machine). Their manifest entries."""
    from pipelines.workers.driver import ensure_ray

    how = (column, str(directory), cfg.routing.pool_snapshots)
    if not cfg.execution.address and todo.height <= PART_TEXTS:
        return build_part(todo.to_arrow(), tokenizer, *how) if todo.height else {}
    ensure_ray(cfg.execution.address, num_cpus=_local_cpus(cfg))
    import ray

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    parts = _parts(todo, max(2 * cpus, math.ceil(todo.height / PART_TEXTS)))
    shared = ray.put(tokenizer)  # one copy in the object store, resolved by each task
    entries: dict[str, PartEntry] = {}
    for result in map_tasks(
        build_part, [(part.to_arrow(), shared, *how) for part in parts], desc="pools: tokenise and write", unit="part"
    ):
        entries.update(result)
    return entries


def _local_cpus(cfg: JobConfig) -> int:
    """The CPUs a local Ray is started with: the job's actors' (the generation step reuses the session)."""
    from pipelines.workers.layout import job_actors

    spec, n = job_actors(cfg)
    return n * spec.threads


def build_part(
    part: pa.Table, tokenizer: PreTrainedTokenizerBase, column: str, directory: str, snapshot: bool
) -> dict[str, PartEntry]:
    """One build task: the part's texts tokenised (unless they are token ids already) and written, pool by pool
    (rows sorted by pool key), as one part file of the store; returns their manifest entries."""
    from pools.build import TOKENS_COLUMN, tokenize
    from pools.store import write_part

    keys = cast("list[str]", part.column("pool_key").to_pylist())
    values = part.column(column).to_pylist()  # texts, or token ids already
    tokens = (
        cast("list[list[int]]", values) if column == TOKENS_COLUMN else tokenize(tokenizer, cast("list[str]", values))
    )
    pools: list[tuple[str, list[list[int]]]] = []
    for key, ids in zip(keys, tokens):
        if not pools or pools[-1][0] != key:
            pools.append((key, []))
        pools[-1][1].append(ids)
    return write_part(directory, pools, snapshot)
