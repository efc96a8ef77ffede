"""Data loading, old/new split, prompts, Ray orchestration, knowledge Parquet, encoding, CTR checks, benchmarks."""
