"""Generative recommendation: for each user with a new history, the top-K next items by constrained beam
search (`laser recommend`), written as recommendation Parquet and evaluated by recall@K and NDCG@K."""
