"""LightGCN: recovers planted taste clusters (with K-means), beats popularity, and its pieces compute right."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from router.groups import collaborative_groups
from router.lightgcn import (LightGCNConfig, bpr_loss, build_graph, normalized_adjacency, popularity_scores,
                             recall_at_k, train_lightgcn)
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
    train = np.array([[0, 0]])             # user 0's item 0 is excluded from ranking
    test = np.array([[0, 2], [0, 1], [1, 0]])
    # user 0 top-2 among items 1..3 = {1, 2}: both held-out hit -> 1.0; user 1 top-2 = {3, 2}: miss -> 0.0
    assert recall_at_k(scores, train, test, k=2) == pytest.approx(0.5)


def test_adjacency_is_symmetric_normalised():
    train = np.array([[0, 0], [0, 1], [1, 1]])  # user 0 (deg 2) - items 0, 1; user 1 (deg 1) - item 1 (deg 2)
    adj = normalized_adjacency(train, 2, 2).to_dense()
    assert torch.allclose(adj, adj.T)
    assert adj[0, 2].item() == pytest.approx(1 / np.sqrt(2 * 1))   # user0-item0
    assert adj[0, 3].item() == pytest.approx(1 / np.sqrt(2 * 2))   # user0-item1
    assert adj[1, 3].item() == pytest.approx(1 / np.sqrt(1 * 2))


def test_bpr_loss_value():
    u = torch.tensor([[1.0, 0.0]])
    assert bpr_loss(u, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]])).item() == pytest.approx(np.log1p(np.exp(-2)))


def test_graph_uses_threshold_and_holds_out_per_user():
    frame = pl.DataFrame({"user_id": ["a"] * 5 + ["b"], "item_id": ["1", "2", "3", "4", "5", "1"],
                          "rating": [5.0, 4.0, 4.0, 4.0, 2.0, 5.0], "timestamp": [0] * 6})
    graph = build_graph(frame, positive_threshold=4.0, holdout_fraction=0.5, seed=0)
    assert graph.item_ids == ["1", "2", "3", "4"]                # item 5 (rating 2) is no positive
    assert len(graph.train) + len(graph.test) == 5
    assert sorted(graph.test[:, 0].tolist()) == [0, 0]           # a: 2 of 4 held out; b keeps its only one


def test_unknown_ids_are_named():
    frame = pl.DataFrame({"user_id": ["a", "zz"], "item_id": ["1", "1"], "rating": [5.0, 5.0], "timestamp": [0, 0]})
    with pytest.raises(ValueError, match="'zz'"):
        build_graph(frame, 4.0, 0.2, 0, known_users=["a"])
