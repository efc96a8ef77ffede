"""Grouping users and items into retrieval-pool groups: LightGCN + K-means, attributes, the binary router."""
