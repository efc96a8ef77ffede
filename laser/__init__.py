"""LASER decoding core: draft trees, tree-attention verification, KV-cache compaction and decoders.

Model-agnostic and free of pipeline concerns: a retrieval pool reaches a decoder only as an object
that can draft a tree (see :class:`laser.drafting.Drafter`).
"""
