"""The job's pools step: Arrow selection, parts written by Ray tasks (or in process), pools kept between builds
when their texts changed little, the global pool only when asked for and capped."""

from __future__ import annotations

import pyarrow as pa
import pytest

import laser
import router
from pipelines.config import JobConfig
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.pool_build import _parts, step_build_pools
from pools.store import PoolStore

WORDS = "the film is a dark war drama funny comedy with great cast of heroes".split()


def _config(tiny_model: str, out, **routing) -> JobConfig:
    return JobConfig.model_validate(
        {
            "model": {"name": tiny_model},
            "output": {"path": str(out)},
            "execution": {"num_workers": 1, "threads_per_worker": 1},
            "routing": {"max_pool_size": 30, **routing},
        }
    )


def _memberships(cfg: JobConfig, groups: int, per_group: int) -> None:
    ids = [f"u{g}-{k}" for g in range(groups) for k in range(per_group)]
    table = pa.table(
        {
            "entity_type": ["user"] * len(ids),
            "entity_id": ids,
            "pool_kind": ["attribute"] * len(ids),
            "group_id": [i.split("-")[0] for i in ids],
            "reason": ["membership"] * len(ids),
        }
    )
    paths = JobPaths.of(cfg)
    paths.root.mkdir(parents=True, exist_ok=True)
    router.write_routing(table, paths.memberships)


def _knowledge(groups: int, per_group: int, edit: set[str] = frozenset()) -> pa.Table:
    ids = [f"u{g}-{k}" for g in range(groups) for k in range(per_group)]
    texts = [
        " ".join(WORDS[(n + j) % len(WORDS)] for j in range(8)) + (" again" if i in edit else "")
        for n, i in enumerate(ids)
    ]
    return pa.table({"entity_type": ["user"] * len(ids), "entity_id": ids, "knowledge": texts})


def _files(cfg: JobConfig) -> dict[str, str]:
    return {k: e["file"] for k, e in PoolStore.open(JobPaths.of(cfg).pools).manifest["pools"].items()}


def test_pools_changed_beyond_the_refresh_share_are_written_again_the_rest_kept(tiny_model, tmp_path):
    cfg = _config(tiny_model, tmp_path / "out", pool_refresh_share=0.1)
    _memberships(cfg, groups=3, per_group=20)
    sizes = step_build_pools(cfg, _knowledge(3, 20))
    assert sizes == {"user/attribute/u0": 20, "user/attribute/u1": 20, "user/attribute/u2": 20}
    first = _files(cfg)
    first_members = PoolStore.open(JobPaths.of(cfg).pools).manifest["members"]
    # u0: 1 text of 20 changed (5%: kept); u1: 3 of 20 (15%: written again); u2 unchanged
    step_build_pools(cfg, _knowledge(3, 20, edit={"u0-1", "u1-1", "u1-2", "u1-3"}))
    second = _files(cfg)
    assert second["user/attribute/u0"] == first["user/attribute/u0"]
    assert second["user/attribute/u2"] == first["user/attribute/u2"]
    assert second["user/attribute/u1"] != first["user/attribute/u1"]
    store = PoolStore.open(JobPaths.of(cfg).pools)
    texts = _knowledge(3, 20, edit={"u1-1", "u1-2", "u1-3"})["knowledge"].to_pylist()[20:40]
    assert (
        store.token_ids("user/attribute/u1")
        == laser.load_tokenizer(tiny_model)(texts, add_special_tokens=False)["input_ids"]
    )  # the new texts
    left = {p.name for p in JobPaths.of(cfg).pools.iterdir()}
    previous = {*first.values(), first_members}  # the generation replaced stays for readers holding it
    assert left == {"manifest.json", *second.values(), store.manifest["members"], *previous}  # nothing older

    exact = _config(tiny_model, tmp_path / "out", pool_refresh_share=0.0)  # any change: u0 written again too
    step_build_pools(exact, _knowledge(3, 20, edit={"u0-1", "u1-1", "u1-2", "u1-3", "u0-2"}))
    assert _files(exact)["user/attribute/u0"] != second["user/attribute/u0"]
    assert _files(exact)["user/attribute/u2"] == first["user/attribute/u2"]


def test_a_corrupt_kept_pool_is_written_again(tiny_model, tmp_path):
    cfg = _config(tiny_model, tmp_path / "out")
    _memberships(cfg, groups=2, per_group=5)
    step_build_pools(cfg, _knowledge(2, 5))
    path = JobPaths.of(cfg).pools / _files(cfg)["user/attribute/u0"]
    path.write_bytes(path.read_bytes()[:-8] + b"garbage!")
    step_build_pools(cfg, _knowledge(2, 5))
    store = PoolStore.open(JobPaths.of(cfg).pools)
    assert [len(store.token_ids(k)) for k in sorted(store.keys())] == [5, 5]


def test_global_pool_only_when_a_decoder_drafts_from_it_and_capped(tiny_model, tmp_path):
    cfg = _config(tiny_model, tmp_path / "out", global_pool_size=25)
    _memberships(cfg, groups=3, per_group=20)
    assert set(step_build_pools(cfg, _knowledge(3, 20))) == {f"user/attribute/u{g}" for g in range(3)}
    assert step_build_pools(cfg, _knowledge(3, 20), pool_need="global") == {"user/global/all": 25}
    both = step_build_pools(cfg, _knowledge(3, 20), pool_need="both")
    assert both["user/global/all"] == 25 and both["user/attribute/u1"] == 20


def test_parts_hold_whole_pools_of_about_equal_size():
    import polars as pl

    sizes = [5, 30, 2, 2, 40, 1, 20]
    todo = pl.DataFrame({"pool_key": [f"k{n}" for n, s in enumerate(sizes) for _ in range(s)]})
    parts = _parts(todo, 4)
    assert pl.concat(parts).equals(todo) and 2 <= len(parts) <= 5
    for part in parts:  # no pool cut in two
        assert not set(part["pool_key"]) & set(pl.concat([p for p in parts if p is not part])["pool_key"])


def test_parts_are_written_by_ray_tasks_as_the_in_process_build_writes_them(
    tiny_model, ray_session, tmp_path, monkeypatch
):
    import ray

    import pipelines.knowledge.pool_build as pool_build

    assert ray.is_initialized()
    local_cfg = _config(tiny_model, tmp_path / "local")
    cfg = _config(tiny_model, tmp_path / "ray")
    for c in (local_cfg, cfg):
        _memberships(c, groups=6, per_group=10)
    monkeypatch.setattr(pool_build, "PART_TEXTS", 20)
    step_build_pools(cfg, _knowledge(6, 10))  # more than one part: Ray tasks
    monkeypatch.undo()
    assert len(set(_files(cfg).values())) >= 2  # several parts, one task each
    ray.shutdown()
    try:
        step_build_pools(local_cfg, _knowledge(6, 10))  # no Ray, one part: in this process
    finally:
        ray.shutdown()
    assert len(set(_files(local_cfg).values())) == 1
    a, b = PoolStore.open(JobPaths.of(cfg).pools), PoolStore.open(JobPaths.of(local_cfg).pools)
    assert a.keys() == b.keys() and all(a.token_ids(k) == b.token_ids(k) for k in a.keys())


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_refresh_share_is_a_share(share):
    with pytest.raises(ValueError, match="pool_refresh_share"):
        JobConfig.model_validate({"routing": {"pool_refresh_share": share}})
