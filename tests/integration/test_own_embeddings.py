"""routing.embeddings: the team's own vectors drive the collaborative groups (LightGCN is not trained);
entities without a vector go to their attribute pool with a counted note; a file matching none of the data's
ids is an error naming it; an incremental run routes afresh when the files change."""

from __future__ import annotations

import fsspec
import numpy as np
import polars as pl
import pytest

import router
from jobs.config import load_config
from pipelines.config import ConfigError
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.routing import step_route

N_CLUSTERS = 3


def _planted(ids: list[str], seed: int = 0) -> tuple[router.Embeddings, dict[str, int]]:
    """Vectors around ``N_CLUSTERS`` well-separated centres; entity k belongs to cluster k % N_CLUSTERS."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10, (N_CLUSTERS, 8))
    cluster = {e: k % N_CLUSTERS for k, e in enumerate(ids)}
    vectors = np.stack([centres[cluster[e]] + rng.normal(0, 0.1, 8) for e in ids])
    return router.Embeddings(ids, vectors), cluster


def _config(tmp_path, users: str, *more: str):
    cfg = load_config(
        None,
        [
            "dataset.synthetic.n_users=40",
            "dataset.synthetic.n_items=30",
            "split.max_hist=5",
            f"output.path={tmp_path / 'out'}",
            f"routing.n_clusters={N_CLUSTERS}",
            "routing.warm_threshold=0",  # every user warm: each goes to its collaborative group if it has one
            "routing.user_policy=warm_cold",
            f"routing.embeddings.users={users}",
            "routing.embeddings.id_column=user",
            "routing.embeddings.vector_column=vec",
            *more,
        ],
    )
    JobPaths.of(cfg).work.mkdir(parents=True, exist_ok=True)
    return cfg


@pytest.fixture
def no_lightgcn(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("LightGCN trained although routing.embeddings is set")

    monkeypatch.setattr(router, "train_lightgcn", refuse)


def _user_ids(tmp_path) -> list[str]:
    cfg = load_config(None, ["dataset.synthetic.n_users=40", "dataset.synthetic.n_items=30"])
    return load_job_data(cfg).dataset.users["user_id"].to_list()


def _collab(routing: pl.DataFrame) -> dict[str, str]:
    rows = routing.filter(pl.col("entity_type") == "user", pl.col("pool_kind") == "collaborative")
    return dict(zip(rows["entity_id"], rows["group_id"]))


def test_users_are_grouped_by_the_teams_vectors_and_lightgcn_is_not_trained(tmp_path, no_lightgcn):
    emb, cluster = _planted(_user_ids(tmp_path))
    path = tmp_path / "users.parquet"
    router.save_embeddings(emb, path, "user", "vec")
    cfg = _config(tmp_path, str(path))
    routing = step_route(cfg, load_job_data(cfg))
    groups = _collab(routing)
    assert set(groups) == set(emb.ids)
    planted = {(a, b) for a in groups for b in groups if cluster[a] == cluster[b]}
    found = {(a, b) for a in groups for b in groups if groups[a] == groups[b]}
    assert found == planted  # the planted clusters, exactly
    assert not (JobPaths.of(cfg).work / "lightgcn").exists()


@pytest.mark.parametrize("least, size, groups", [(1, 14, 3), (1, 40, 1), (1, 1, 40), (7, 14, 7), (7, "null", 7)])
def test_a_target_group_size_sets_the_number_of_groups_from_the_catalogue(tmp_path, no_lightgcn, least, size, groups):
    emb, cluster = _planted(_user_ids(tmp_path))
    path = tmp_path / "users.parquet"
    router.save_embeddings(emb, path, "user", "vec")
    cfg = _config(tmp_path, str(path), f"routing.n_clusters={least}", f"routing.target_group_size={size}")
    found = _collab(step_route(cfg, load_job_data(cfg)))
    assert len(set(found.values())) == groups  # max(n_clusters, ceil(40 / size)) groups
    if groups == N_CLUSTERS:  # as many groups as planted clusters: the planted clusters, exactly
        assert {(a, b) for a in found for b in found if found[a] == found[b]} == {
            (a, b) for a in found for b in found if cluster[a] == cluster[b]
        }


def test_users_without_a_vector_are_routed_cold_with_a_counted_note(tmp_path, no_lightgcn):
    ids = _user_ids(tmp_path)
    emb, _ = _planted(ids)
    path = f"memory://{tmp_path.name}/users.parquet"  # a URI, read as dataset.path is
    with fsspec.open(path, "wb") as fh:
        kept = emb.subset(ids[5:])
        pl.DataFrame({"user": kept.ids, "vec": kept.vectors.tolist()}).write_parquet(fh)
    cfg = _config(tmp_path, path)
    data = load_job_data(cfg)
    routing = step_route(cfg, data)
    missing = routing.filter(pl.col("entity_id").is_in(ids[:5]))
    assert missing["pool_kind"].to_list() == ["attribute"] * 5
    assert all("no embedding" in r for r in missing["reason"])
    assert set(_collab(routing)) == set(ids[5:])
    note = data.dataset.notes["users_without_embedding"]
    assert note["count"] == 5 and note["first"] == ids[:5] and note["file"].endswith(f"{tmp_path.name}/users.parquet")


def test_a_file_whose_ids_match_no_entity_is_one_error_naming_it(tmp_path, no_lightgcn):
    emb, _ = _planted([f"customer-{k}" for k in range(12)])
    path = tmp_path / "vectors.parquet"
    router.save_embeddings(emb, path, "user", "vec")
    cfg = _config(tmp_path, str(path))
    with pytest.raises(router.EmbeddingError, match=r"vectors\.parquet: none of its 12 ids .* is a user of the data"):
        step_route(cfg, load_job_data(cfg))


def test_a_missing_column_names_the_file_and_the_column(tmp_path, no_lightgcn):
    emb, _ = _planted(_user_ids(tmp_path))
    path = tmp_path / "users.parquet"
    router.save_embeddings(emb, path, "id", "vec")
    cfg = _config(tmp_path, str(path))
    with pytest.raises(router.EmbeddingError, match=r"users\.parquet: no column 'user'"):
        step_route(cfg, load_job_data(cfg))


def test_a_collaborative_policy_without_its_vectors_fails_at_config_load(tmp_path):
    with pytest.raises(ConfigError, match="routing.item_policy 'collaborative' needs item vectors"):
        _config(tmp_path, "users.parquet", "routing.item_policy=collaborative")


def test_an_incremental_run_routes_afresh_when_the_vectors_change(tmp_path, no_lightgcn, monkeypatch):
    ids = _user_ids(tmp_path)
    path = tmp_path / "users.parquet"
    router.save_embeddings(_planted(ids)[0], path, "user", "vec")
    cfg = _config(tmp_path, str(path))
    data = load_job_data(cfg)
    step_route(cfg, data)
    clustered = []
    real = router.collaborative_groups
    monkeypatch.setattr(router, "collaborative_groups", lambda *a, **k: clustered.append(1) or real(*a, **k))
    step_route(cfg, data, incremental=True)
    assert not clustered  # same interactions, same files: the routing is kept
    router.save_embeddings(_planted(ids, seed=1)[0].subset(ids[:-1]), path, "user", "vec")  # the team re-trained
    step_route(cfg, data, incremental=True)
    assert clustered  # routed afresh over the new vectors
