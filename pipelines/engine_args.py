"""vLLM's own engine arguments in a job config (``model.engine_args``).

The names vLLM accepts are the fields of its ``EngineArgs`` dataclass, read from the installed vLLM's
source (parsed, never imported: :func:`laser.vllm.requirements.class_fields`), and only when a config names
an engine argument or an unknown key (a config without either loads without importing laser). Where
vLLM is not installed the names cannot be checked; the arguments the job sets itself are refused either
way (:data:`JOB_SETS`), naming the config key that sets them.
"""

from __future__ import annotations

import difflib
import functools

# vLLM arguments the job's engine sets itself -> what sets them (a config key, or the engine's reason)
JOB_SETS: dict[str, str] = {
    "model": "model.name",
    "tokenizer": "model.name",
    "revision": "model.revision",
    "tokenizer_revision": "model.revision",
    "trust_remote_code": "model.trust_remote_code",
    "max_model_len": "model.max_model_len",
    "dtype": "model.dtype",
    "seed": "dataset.seed",
    "max_num_seqs": "execution.batch_size",
    "enforce_eager": "execution.compile",
    "tensor_parallel_size": "execution.gpus_per_worker",
    "gpu_memory_utilization": "execution.gpu_memory_utilization",
    "speculative_config": "decoder.name and decoder.params (LASER is the job's drafter)",
    "enable_prefix_caching": "the job's engine (drafts and prompts share cached KV blocks)",
    "max_num_batched_tokens": "the job's engine (from execution.batch_size and the longest draft)",
    "block_size": "the job's engine (the prefix cache's unit)",
}


@functools.cache
def vllm_engine_arg_names() -> frozenset[str] | None:
    """The fields of the installed vLLM's ``EngineArgs`` (None: no vLLM, or its source has no such class).
    Read by laser's vLLM requirements reader, imported here only when a name must be checked."""
    from laser.vllm.requirements import class_fields, installed_source

    source = installed_source()
    return None if source is None else class_fields(source, "vllm.engine.arg_utils", "EngineArgs")


def engine_arg_problem(name: str) -> str | None:
    """Why ``name`` cannot be one of ``model.engine_args`` (None: it can)."""
    if name in JOB_SETS:
        return f"the job sets vLLM's {name} itself, from {JOB_SETS[name]}: set it there"
    known = vllm_engine_arg_names()
    if known is None or name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    if close and close[0] in JOB_SETS:
        hint += f" (the job sets that one itself, from {JOB_SETS[close[0]]})"
    return f"not one of vLLM's engine arguments (the fields of its EngineArgs){hint}"
