"""Benchmarks: each prints a table and writes JSON (+ PNG plots)."""
