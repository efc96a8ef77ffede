"""Operating the job on a schedule: run ledger, output lock, incremental selection, latest view.

Modules are imported directly (``pipelines.schedule.incremental`` etc.); this package file stays
import-free so that ``pipelines.job`` can use :mod:`pipelines.schedule.sources` without a cycle.
"""
