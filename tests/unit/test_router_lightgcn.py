"""LightGCN: recovers planted taste clusters (with K-means), beats popularity, its pieces compute right, an
epoch propagates once, evaluation is chunked and sampled, and a warm start begins from the earlier vectors."""

from __future__ import annotations

import logging

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

import router.lightgcn as lgcn
from router.embeddings import Embeddings
from router.groups import collaborative_groups
from router.lightgcn import (
    LightGCN,
    LightGCNConfig,
    WarmStart,
    bpr_loss,
    build_graph,
    chunked_recall,
    eval_sample,
    normalized_adjacency,
    popularity_scores,
    recall_at_k,
    train_lightgcn,
)
from router.synthetic import planted_interactions

CONFIG = LightGCNConfig(embedding_dim=16, max_epochs=60, eval_every=5, patience=3, progress=False, seed=3)


@pytest.fixture(scope="module")
def planted():
    graph = planted_interactions(n_users=150, n_items=120, n_ratings=3000, n_clusters=3, seed=7)
    return graph, train_lightgcn(graph.interactions, CONFIG)


def test_kmeans_on_lightgcn_recovers_planted_user_clusters(planted):
    graph, result = planted
    groups = collaborative_groups(result.users, n_clusters=3, seed=0)
    truth = [graph.user_cluster[u] for u in groups["entity_id"]]
    assert adjusted_rand_score(truth, groups["group_id"].to_list()) >= 0.8


def test_lightgcn_beats_popularity_on_recall_at_20(planted):
    _, result = planted
    graph = build_graph(planted[0].interactions, CONFIG.positive_threshold, CONFIG.holdout_fraction, CONFIG.seed)
    popularity = recall_at_k(popularity_scores(graph.train, graph.num_users, graph.num_items), graph.train, graph.test)
    assert result.best_recall > popularity + 0.05
    assert result.history and result.best_epoch in [e for e, _ in result.history]


def test_training_is_deterministic_for_a_seed(planted):
    graph, result = planted
    again = train_lightgcn(graph.interactions, CONFIG)
    np.testing.assert_array_equal(result.users.vectors, again.users.vectors)


def test_recall_at_k_hand_computed():
    scores = np.array([[0.9, 0.8, 0.1, 0.0], [0.1, 0.2, 0.3, 0.4]])
    train = np.array([[0, 0]])  # user 0's item 0 is excluded from ranking
    test = np.array([[0, 2], [0, 1], [1, 0]])
    # user 0 top-2 among items 1..3 = {1, 2}: both held-out hit -> 1.0; user 1 top-2 = {3, 2}: miss -> 0.0
    assert recall_at_k(scores, train, test, k=2) == pytest.approx(0.5)


def test_adjacency_is_symmetric_normalised():
    train = np.array([[0, 0], [0, 1], [1, 1]])  # user 0 (deg 2) - items 0, 1; user 1 (deg 1) - item 1 (deg 2)
    adj = normalized_adjacency(train, 2, 2).to_dense()
    assert torch.allclose(adj, adj.T)
    assert adj[0, 2].item() == pytest.approx(1 / np.sqrt(2 * 1))  # user0-item0
    assert adj[0, 3].item() == pytest.approx(1 / np.sqrt(2 * 2))  # user0-item1
    assert adj[1, 3].item() == pytest.approx(1 / np.sqrt(1 * 2))


def test_bpr_loss_value():
    u = torch.tensor([[1.0, 0.0]])
    assert bpr_loss(u, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]])).item() == pytest.approx(
        np.log1p(np.exp(-2))
    )


def test_graph_uses_threshold_and_holds_out_per_user():
    frame = pl.DataFrame(
        {
            "user_id": ["a"] * 5 + ["b"],
            "item_id": ["1", "2", "3", "4", "5", "1"],
            "rating": [5.0, 4.0, 4.0, 4.0, 2.0, 5.0],
            "timestamp": [0] * 6,
        }
    )
    graph = build_graph(frame, positive_threshold=4.0, holdout_fraction=0.5, seed=0)
    assert graph.item_ids == ["1", "2", "3", "4"]  # item 5 (rating 2) is no positive
    assert len(graph.train) + len(graph.test) == 5
    assert sorted(graph.test[:, 0].tolist()) == [0, 0]  # a: 2 of 4 held out; b keeps its only one


def test_unknown_ids_are_named():
    frame = pl.DataFrame({"user_id": ["a", "zz"], "item_id": ["1", "1"], "rating": [5.0, 5.0], "timestamp": [0, 0]})
    with pytest.raises(ValueError, match="'zz'"):
        build_graph(frame, 4.0, 0.2, 0, known_users=["a"])


# --- cost: one propagation an epoch, chunked and sampled evaluation ------------------------------------------


def _small():
    graph = planted_interactions(n_users=60, n_items=50, n_ratings=900, n_clusters=3, seed=1)
    split = build_graph(graph.interactions, 4.0, 0.2, 0)
    return graph, split, normalized_adjacency(split.train, split.num_users, split.num_items)


class _Spy:
    """Counts LightGCN.forward calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = LightGCN.forward

        def forward(model, adjacency):
            self.calls += 1
            return real(model, adjacency)

        monkeypatch.setattr(LightGCN, "forward", forward)


@pytest.mark.parametrize("propagations", [1, 3])
def test_an_epoch_propagates_once_per_step_whatever_the_batch_size(monkeypatch, propagations):
    _, split, adjacency = _small()
    config = LightGCNConfig(embedding_dim=8, batch_size=16, propagations_per_epoch=propagations, progress=False)
    model = LightGCN(split.num_users, split.num_items, 8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train = torch.as_tensor(split.train)
    assert len(train) > 10 * config.batch_size  # a propagation per mini-batch would be 10+ calls
    spy = _Spy(monkeypatch)
    before = model.embedding.weight.detach().clone()
    lgcn._train_epoch(model, adjacency, train, optimizer, config, torch.Generator().manual_seed(0))
    assert spy.calls == propagations
    assert not torch.equal(before, model.embedding.weight)  # the gradient reached the layer-0 parameters


def test_sparse_propagation_matches_dense_forward_and_gradient():
    _, split, adjacency = _small()
    torch.manual_seed(0)
    model = LightGCN(split.num_users, split.num_items, 4, 3)
    weights = torch.randn(split.num_users + split.num_items, 2)
    grads = []
    for matrix in (lgcn.sparse_csr(adjacency), adjacency, adjacency.to_dense()):
        model.zero_grad()
        users, items = model(matrix)
        (torch.cat([users, items]) @ torch.ones(4, 2) * weights).sum().backward()
        grads.append((torch.cat([users, items]).detach(), model.embedding.weight.grad.clone()))
    for output, grad in grads[:2]:
        torch.testing.assert_close(output, grads[2][0])
        torch.testing.assert_close(grad, grads[2][1])


def test_chunked_loss_gives_the_whole_steps_gradient():
    _, split, adjacency = _small()
    train = torch.as_tensor(split.train)
    negatives = torch.randint(split.num_items, (len(train), 1), generator=torch.Generator().manual_seed(0))
    triples = torch.cat([train, negatives], 1)
    grads = []
    for chunk in (7, 10**6):
        torch.manual_seed(0)
        model = LightGCN(split.num_users, split.num_items, 8, 3)
        lgcn._train_step(model, adjacency, triples, LightGCNConfig(batch_size=chunk, weight_decay=0.1))
        grads.append(model.embedding.weight.grad.clone())
    torch.manual_seed(0)
    model = LightGCN(split.num_users, split.num_items, 8, 3)  # the loss written out, unchunked
    users, items = model(adjacency)
    u, p, q = triples.T
    layer0 = model.embedding.weight
    reg = layer0[u].pow(2).sum() + layer0[p + split.num_users].pow(2).sum() + layer0[q + split.num_users].pow(2).sum()
    (bpr_loss(users[u], items[p], items[q]) + 0.1 * reg / (2 * len(u))).backward()
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[1], model.embedding.weight.grad)


def test_chunked_evaluation_matches_dense_recall_in_bounded_chunks(monkeypatch):
    _, split, _ = _small()
    rng = np.random.default_rng(0)
    users = torch.as_tensor(rng.normal(size=(split.num_users, 4)))
    items = torch.as_tensor(rng.normal(size=(split.num_items, 4)))
    shapes = []
    real = lgcn._chunk_scores
    monkeypatch.setattr(lgcn, "_chunk_scores", lambda u, i: shapes.append((u.shape[0], i.shape[0])) or real(u, i))
    sample = eval_sample(split, max_users=10**6, seed=0)
    dense = recall_at_k((users @ items.T).numpy(), split.train, split.test, k=5)
    assert chunked_recall(users, items, sample, k=5, chunk=8) == pytest.approx(dense)
    assert max(rows for rows, _ in shapes) <= 8 and sum(rows for rows, _ in shapes) == len(sample.users)
    shapes.clear()
    monkeypatch.setattr(lgcn, "_EVAL_SCORES", 3 * split.num_items)  # a large catalogue: fewer users a chunk
    assert chunked_recall(users, items, sample, k=5, chunk=8) == pytest.approx(dense)
    assert max(rows for rows, _ in shapes) <= 3


def test_evaluation_samples_a_seeded_bounded_set_of_users():
    _, split, _ = _small()
    testers = np.unique(split.test[:, 0])
    sample = eval_sample(split, max_users=10, seed=4)
    assert len(sample.users) == 10 and set(sample.users) <= set(testers)
    np.testing.assert_array_equal(sample.users, eval_sample(split, 10, seed=4).users)
    assert set(sample.test[:, 0]) == set(range(10)) and sample.train[:, 0].max() < 10
    for row, user in enumerate(sample.users):  # a sampled user's pairs are all of that user's
        assert sorted(sample.test[sample.test[:, 0] == row, 1]) == sorted(split.test[split.test[:, 0] == user, 1])


# --- warm start -----------------------------------------------------------------------------------------------


WARM = LightGCNConfig(embedding_dim=8, max_epochs=6, warm_epochs=2, eval_every=1, patience=5, progress=False, seed=2)


def _first_epoch_weights(monkeypatch):
    """Record the layer-0 weights each training starts its first epoch from."""
    starts = []
    real = lgcn._train_epoch

    def spy(model, *args):
        if len(starts) == 0 or starts[-1][0] is not model:
            starts.append((model, model.embedding.weight.detach().clone()))
        return real(model, *args)

    monkeypatch.setattr(lgcn, "_train_epoch", spy)
    return starts


def test_warm_start_keeps_known_vectors_and_initialises_new_ids(monkeypatch):
    graph, _, _ = _small()
    frame = graph.interactions
    earlier = train_lightgcn(frame.filter(~pl.col("user_id").is_in(["u0", "u1"]) & (pl.col("item_id") != "i3")), WARM)
    assert "u0" not in earlier.users.ids and "i3" not in earlier.items.ids
    starts = _first_epoch_weights(monkeypatch)
    cold = train_lightgcn(frame, WARM)
    warm = train_lightgcn(frame, WARM, init=earlier)
    assert not cold.warm_started and warm.warm_started and warm.epochs <= WARM.warm_epochs < cold.epochs
    (_, cold_start), (_, warm_start) = starts
    n_users = len(warm.users.ids)
    known_users, known_items = earlier.layer0.users, earlier.layer0.items
    for ids, known, offset in ((warm.users.ids, known_users, 0), (warm.items.ids, known_items, n_users)):
        for row, entity in enumerate(ids):
            expected = (
                torch.as_tensor(known.subset([entity]).vectors[0]) if entity in known.ids else cold_start[row + offset]
            )  # a new id: what a cold start gives it
            torch.testing.assert_close(warm_start[row + offset], expected)


def test_warm_start_saves_and_loads_and_falls_back(tmp_path, caplog):
    earlier = train_lightgcn(_small()[0].interactions, WARM)
    assert WarmStart.load(tmp_path / "none") is None
    earlier.layer0.save(tmp_path / "lgcn")
    loaded = WarmStart.load(tmp_path / "lgcn")
    assert loaded.users.ids == earlier.layer0.users.ids
    np.testing.assert_array_equal(loaded.items.vectors, earlier.layer0.items.vectors)
    (tmp_path / "lgcn" / "items.parquet").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        assert WarmStart.load(tmp_path / "lgcn") is None
    assert "unreadable" in caplog.text


def test_warm_start_of_another_width_few_ids_or_disabled_trains_from_scratch():
    frame = _small()[0].interactions
    other = WarmStart(Embeddings(["u1"], np.ones((1, 3))), Embeddings(["i1"], np.ones((1, 3))))
    assert not train_lightgcn(frame, WARM, init=other).warm_started
    earlier = train_lightgcn(frame, WARM)
    known = earlier.layer0
    few = WarmStart(known.users.subset(known.users.ids[:5]), known.items.subset(known.items.ids[:20]))
    assert not train_lightgcn(frame, WARM, init=few).warm_started  # 25 of 110 users and items
    off = LightGCNConfig(**{**WARM.__dict__, "warm_epochs": 0})
    assert not train_lightgcn(frame, off, init=earlier).warm_started


def test_the_job_saves_its_parameters_and_warm_starts_the_next_run(tmp_path, monkeypatch):
    import router
    from jobs.config import load_config
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.routing import groups_of

    runs = []
    real = router.train_lightgcn
    monkeypatch.setattr(router, "train_lightgcn", lambda *a, **kw: runs.append(kw.get("init")) or real(*a, **kw))
    cfg = load_config(
        None,
        [
            "dataset.synthetic.n_users=12",
            "dataset.synthetic.n_items=16",
            "split.max_hist=4",
            "routing.n_clusters=2",
            f"output.path={tmp_path / 'out'}",
            "routing.lightgcn={max_epochs: 3, warm_epochs: 1}",
        ],
    )
    groups_of(cfg, load_job_data(cfg))
    saved = WarmStart.load(tmp_path / "out" / "lightgcn")
    groups_of(cfg, load_job_data(cfg))
    assert runs[0] is None and saved is not None
    assert runs[1].users.ids == saved.users.ids
    np.testing.assert_array_equal(runs[1].items.vectors, saved.items.vectors)
