"""Operating the job on a schedule: run ledger, output lock, incremental selection, latest view.

Modules are imported directly (``pipelines.ops.schedule.incremental`` etc.). The rows' source hash, which
the job itself computes, lives below the job in :mod:`pipelines.knowledge.sources`.
"""
