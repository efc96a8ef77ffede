"""An incremental run keeps the last routing while few interactions are new: no LightGCN, no K-means; new
entities go to their attribute group, in the routing and the membership tables."""

from __future__ import annotations

import polars as pl
import pytest

import router
from jobs.config import load_config
from pipelines.data.split import split_old_new
from pipelines.knowledge.inputs import JobData, load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.routing import step_route


@pytest.fixture
def routed(tmp_path):
    cfg = load_config(
        None,
        [
            "dataset.synthetic.n_users=40",
            "dataset.synthetic.n_items=30",
            "split.max_hist=5",
            f"output.path={tmp_path / 'out'}",
            "routing.n_clusters=2",
            "routing.warm_threshold=2",
        ],
    )
    JobPaths.of(cfg).work.mkdir(parents=True)
    data = load_job_data(cfg)
    first = step_route(cfg, data)
    return cfg, data, first


def _with(data: JobData, rows: list[tuple[str, str, float, int]], users: list[str] = ()) -> JobData:
    ds = data.dataset
    ds.interactions = pl.concat([ds.interactions, pl.DataFrame(rows, schema=ds.interactions.schema, orient="row")])
    if users:
        ds.users = pl.concat([ds.users, ds.users.head(len(users)).with_columns(user_id=pl.Series(users))])
    return JobData(ds, split_old_new(ds, max_hist=5, mode="latest"))


def _no_training(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("LightGCN trained on a run that keeps the routing")

    monkeypatch.setattr(router, "train_lightgcn", refuse)


def test_few_new_interactions_keep_the_routing_and_new_users_get_attribute_groups(routed, monkeypatch):
    cfg, data, first = routed
    newest = data.dataset.interactions["timestamp"].max()
    data = _with(data, [("u_new", data.dataset.items["item_id"][0], 5.0, newest + 1)], users=["u_new"])
    _no_training(monkeypatch)
    kept = step_route(cfg, data, incremental=True)
    assert (
        kept.filter(pl.col("entity_id") != "u_new")
        .sort("entity_type", "entity_id")
        .equals(first.sort("entity_type", "entity_id"))
    )
    row = kept.filter(pl.col("entity_id") == "u_new").to_dicts()
    assert len(row) == 1 and row[0]["pool_kind"] == "attribute"
    paths = JobPaths.of(cfg)
    saved = pl.from_arrow(router.read_routing(paths.routing))
    assert saved.height == first.height + 1
    members = pl.from_arrow(router.read_routing(paths.memberships))
    assert members.filter(pl.col("entity_id") == "u_new")["group_id"].to_list() == [row[0]["group_id"]]


def test_many_new_interactions_or_a_full_run_route_afresh(routed, monkeypatch):
    cfg, data, _ = routed
    newest = data.dataset.interactions["timestamp"].max()
    items = data.dataset.items["item_id"].to_list()
    users = data.dataset.users["user_id"].to_list()
    many = [(u, items[(k * 7) % len(items)], 4.0, newest + k + 1) for k, u in enumerate(users * 3)]
    data = _with(data, many)  # far more than 10% of the interactions are new
    _no_training(monkeypatch)
    with pytest.raises(AssertionError, match="LightGCN trained"):
        step_route(cfg, data, incremental=True)


def test_retrain_share_zero_routes_every_run_afresh(routed, monkeypatch):
    cfg, data, _ = routed
    newest = data.dataset.interactions["timestamp"].max()
    data = _with(data, [(data.dataset.users["user_id"][0], data.dataset.items["item_id"][0], 5.0, newest + 1)])
    _no_training(monkeypatch)
    every_run = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"retrain_share": 0.0})})
    with pytest.raises(AssertionError, match="LightGCN trained"):
        step_route(every_run, data, incremental=True)
    assert step_route(cfg, data, incremental=True).height > 0  # the default keeps it
