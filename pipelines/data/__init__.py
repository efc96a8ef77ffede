"""Recommendation datasets: canonical tables, loaders, the synthetic demo generator and the old/new split."""

from pipelines.data.config import DatasetConfig, SyntheticParams, TableColumns
from pipelines.data.load import limit_dataset, load_dataset
from pipelines.data.schema import Dataset, Split
from pipelines.data.split import split_old_new
from pipelines.data.synthetic import synthetic_dataset

__all__ = [
    "Dataset",
    "DatasetConfig",
    "Split",
    "SyntheticParams",
    "TableColumns",
    "limit_dataset",
    "load_dataset",
    "split_old_new",
    "synthetic_dataset",
]
