"""What every run keeps beside its knowledge: the output lock, the run ledger, the latest view, and the
exit codes a scheduler acts on. The job (pipelines/knowledge/job.py) takes the lock, writes the ledger
and publishes the latest view; an incremental run only plans another entity set (pipelines/knowledge/plan.py).
"""
