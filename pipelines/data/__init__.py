"""Recommendation datasets: canonical tables, loaders, the synthetic demo generator and the old/new split."""
from pipelines.data.schema import Dataset, Split

__all__ = ["Dataset", "Split"]
