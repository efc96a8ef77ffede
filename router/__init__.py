"""Grouping users and items into retrieval-pool groups: LightGCN + K-means, attributes, the binary router.

Files: ``lightgcn`` (train embeddings), ``embeddings`` (validated container, saved and loaded as Parquet),
``groups`` (K-means collaborative groups, attribute groups), ``router`` (the binary router and its
routing table), ``synthetic`` (planted taste-cluster graphs for tests and benchmarks).
"""

from router.embeddings import EmbeddingError, Embeddings, load_embeddings, save_embeddings
from router.groups import AttributeGrouping, attribute_groups, collaborative_groups
from router.lightgcn import LightGCNConfig, LightGCNResult, WarmStart, train_lightgcn
from router.router import (
    ATTRIBUTE,
    COLLABORATIVE,
    ROUTING_SCHEMA,
    EntityInfo,
    group_memberships,
    interaction_counts,
    read_routing,
    route,
    write_routing,
)

__all__ = [
    "ATTRIBUTE",
    "COLLABORATIVE",
    "ROUTING_SCHEMA",
    "AttributeGrouping",
    "EmbeddingError",
    "Embeddings",
    "EntityInfo",
    "LightGCNConfig",
    "LightGCNResult",
    "WarmStart",
    "attribute_groups",
    "collaborative_groups",
    "group_memberships",
    "interaction_counts",
    "load_embeddings",
    "read_routing",
    "route",
    "save_embeddings",
    "train_lightgcn",
    "write_routing",
]
