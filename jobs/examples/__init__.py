"""Example files for operating the pipeline (scheduler integrations)."""
