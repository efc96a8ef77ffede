"""Benchmarks (a research tool, above the pipeline: nothing in `laser`, `pools`, `router`, `pipelines` or `jobs`
imports it): each `laser bench` command (`cli.py`) prints a table and writes JSON (+ PNG plots)."""
