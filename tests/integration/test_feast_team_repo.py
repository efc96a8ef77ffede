"""`laser ingest feast --repo DIR`: the knowledge features into a team's own Feast repository, for real, with two
online stores: SQLite, and Redis served by a server the test starts (redis-server where it is installed, else
fakeredis's TCP server, which speaks the same protocol to Feast's redis client). The team's repository already
has a `user` entity and a feature view of its own; both stay."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from benchmarks.fuzz_server import free_port
from typer.testing import CliRunner

from pipelines.store.knowledge import KnowledgeWriter
from pipelines.ops.features.feast_repo import online_features
from pipelines.ops.features.team_repo import RepoError, ingest_into
from pipelines.store.lock import output_lock
from pipelines.ops.schedule.latest import update_latest
from tests.helpers import run_row

pytest.importorskip("feast")

YAML = """\
project: team_features
provider: local
registry: {registry}
online_store:
{online}
offline_store:
  type: file
entity_key_serialization_version: 3
"""


@pytest.fixture(scope="module")
def redis_address() -> Iterator[str]:
    """A Redis server for the test: the real one when installed, else fakeredis over TCP."""
    port = free_port()
    if shutil.which("redis-server"):
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
        )
        try:
            for _ in range(100):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        return
    from fakeredis import TcpFakeServer

    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{port}"
    server.shutdown()


def _team_repo(root: Path, online: str) -> Path:
    """A team's repository: its own `user` entity and a feature view of its own, applied before we come."""
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Int64

    root.mkdir(parents=True)
    (root / "feature_store.yaml").write_text(YAML.format(registry=root / "registry.db", online=online))
    clicks = root / "clicks.parquet"
    stamp = pl.lit("2026-01-01T00:00:00").str.to_datetime(time_zone="UTC").alias("event_timestamp")
    pl.DataFrame({"user_id": ["u0"], "clicks": [3]}).with_columns(stamp).write_parquet(clicks)
    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.STRING)
    view = FeatureView(
        name="user_clicks",
        entities=[user],
        ttl=timedelta(days=3650),
        source=FileSource(path=str(clicks), timestamp_field="event_timestamp"),
        schema=[Field(name="clicks", dtype=Int64)],
    )
    FeatureStore(repo_path=str(root)).apply([user, view])
    return root


def _output(tmp: Path, users: list[str], items: list[str], run_id: str, text: str) -> Path:
    out = tmp / "job"
    with KnowledgeWriter(out / "knowledge", shard_rows=4, run_id=run_id) as w:
        for k, e in enumerate(users):
            w.add(run_row("user", e, f"User {e} {text} film {k}.", run_id))
        for k, e in enumerate(items):
            w.add(run_row("item", e, f"A {text} film called {e} ({k}).", run_id))
    _refresh_latest(out)
    return out


def _refresh_latest(out: Path) -> None:
    with output_lock(out, run_id="test"):
        update_latest(out, out / "knowledge", out / "old_knowledge")


def _served(repo: Path, out: Path) -> int:
    """Every entity of the feature tables is served by the team's online store, text and vector alike."""
    from feast import FeatureStore

    store, checked = FeatureStore(repo_path=str(repo)), 0
    for etype in ("user", "item"):
        table = pl.read_parquet(out / "features" / f"{etype}_knowledge.parquet")
        got = online_features(store, etype, table[f"{etype}_id"].to_list())
        assert got["knowledge"] == table["knowledge"].to_list()
        for mine, theirs in zip(table["knowledge_vector"].to_list(), got["knowledge_vector"]):
            assert np.array_equal(np.asarray(mine, np.float32), np.asarray(theirs, np.float32))
        checked += table.height
    return checked


@pytest.mark.parametrize("online", ["sqlite", "redis"])
def test_the_knowledge_goes_into_the_team_s_own_repo_and_online_store(tmp_path, online, request):
    from feast import FeatureStore

    if online == "redis":
        address = request.getfixturevalue("redis_address")
        spec = f"  type: redis\n  connection_string: {address}"
    else:
        spec = f"  type: sqlite\n  path: {tmp_path / 'online.db'}"
    repo = _team_repo(tmp_path / "team", spec)
    users, items = [f"u{i}" for i in range(8)], [f"i{i}" for i in range(4)]
    out = _output(tmp_path, users, items, "r1", "likes")
    assert ingest_into(repo, out) == {"user_knowledge": 8, "item_knowledge": 4}
    assert _served(repo, out) == 12  # every written entity
    store = FeatureStore(repo_path=str(repo))
    assert {v.name for v in store.list_feature_views()} >= {"user_clicks", "user_knowledge", "item_knowledge"}
    assert store.get_online_features(["user_clicks:clicks"], [{"user_id": "u0"}]).to_dict()["clicks"] is not None

    time.sleep(1.0)  # a later run rewrites two users: only they are pushed
    with KnowledgeWriter(out / "knowledge", shard_rows=4, run_id="r2") as w:
        for u in ("u2", "u5"):
            w.add(run_row("user", u, f"User {u} now prefers documentaries.", "r2"))
    _refresh_latest(out)
    assert ingest_into(repo, out) == {"user_knowledge": 2, "item_knowledge": 0}
    assert _served(repo, out) == 12
    assert "documentaries" in online_features(store, "user", ["u5"])["knowledge"][0]


def test_a_repo_whose_user_joins_on_another_key_is_named(tmp_path):
    from feast import Entity, FeatureStore, ValueType

    repo = tmp_path / "team"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text(
        YAML.format(registry=repo / "registry.db", online=f"  type: sqlite\n  path: {tmp_path / 'o.db'}")
    )
    FeatureStore(repo_path=str(repo)).apply([Entity(name="user", join_keys=["customer"], value_type=ValueType.STRING)])
    out = _output(tmp_path, ["u0"], ["i0"], "r1", "likes")
    with pytest.raises(RepoError, match="entity 'user' joins on 'customer'"):
        ingest_into(repo, out)
    with pytest.raises(RepoError, match="no feature_store.yaml"):
        ingest_into(tmp_path / "nowhere", out)


def test_the_cli_takes_the_repo(tmp_path):
    import yaml

    from jobs.cli import app

    repo = _team_repo(tmp_path / "team", f"  type: sqlite\n  path: {tmp_path / 'online.db'}")
    out = _output(tmp_path, ["u0", "u1"], ["i0"], "r1", "likes")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"output": {"path": str(out)}}))
    res = CliRunner().invoke(app, ["ingest", "feast", str(config), "--repo", str(repo)])
    assert res.exit_code == 0, res.output
    assert f"{repo}: pushed 2 user_knowledge, 1 item_knowledge" in res.output
