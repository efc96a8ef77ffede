"""The job's knowledge work as the pipeline users would write instead: Ray Data LLM over plain vLLM.

``laser bench engines`` runs it in a fresh process (``python -m benchmarks.rows ray-data-llm CONFIG --out DIR
[--set k=v ...] [--speculation none|ngram|suffix]``, which loads the config and calls :func:`run`), timed
from process start to its last row like the job's own rows. Same work as the job, built with the job's own code:

- the same entities: the job's dataset and seeded old/new split (``load_job_data``), the old-knowledge
  requests (``old_requests``: users with an old history, existing items) and the new-knowledge requests
  (``new_requests``: users with new history, new items) that a fresh run of the job generates;
- the same prompts and tokens: each request's chat message made as the job's worker makes it
  (``pipelines/knowledge/prompts.py``: history cut to ``generation.max_prompt_tokens`` with the model's
  tokenizer, word count from the token budget), chat-templated as the decoders' ``encode`` does; the
  token ids go to vLLM as they are (``tokenized_prompt``: Ray Data's chat-template and tokenize stages
  are off, so nothing can differ; tests/integration/test_bench_ray_data_llm.py checks the ids against the
  worker's own);
- the same model folder (``laser.models.model_dir(model.name)``), dtype, token budgets (old
  pass: ``old_knowledge.max_new_tokens``; new pass: ``generation.max_new_tokens``), greedy decoding and
  the generation rules vLLM has (repetition penalty, min tokens, stop strings, and the first text's genre
  ban under ``generation.ban_unsupported_genres``);
- the same resources: ``execution.num_workers`` vLLM engines (Ray Data's ``concurrency``, as a fixed pool
  ``(n, n)``: a plain ``n`` would autoscale from one engine), each holding
  ``threads_per_worker`` CPUs and OMP threads, ``execution.batch_size`` requests in flight per engine
  (``max_num_seqs`` and Ray Data's ``batch_size``), local Ray with ``num_workers x threads`` CPUs, vLLM's
  KV cache, context length, prefix caching and KV block size (``laser.vllm.env.default_block_size``:
  32 tokens on CPU, so the prompts' shared opening is served from the cache as in the job) as the job's
  vLLM workers set them.

On a CPU, Ray Data LLM needs three non-default settings (``docs/engines.md``):
``placement_group_config`` with CPU bundles (else its vLLM stage waits for a GPU forever),
``log_engine_metrics=False`` (else the engine actor dies in its constructor) and ``detokenize_stage=False``
(vLLM detokenizes itself).

The two passes run one after the other, as in the job (old knowledge first, then new); each is its own
Ray Data execution, so each starts its own engines (Ray Data keeps no actor between datasets, where the
job's actors serve both passes). Per pass the summary holds: entities, wall seconds (engine start
included), tokens, and the **engines' running rate** (:func:`pass_figures`: the pass's entities over the
seconds from its engine's readiness to the pass's end; comparable with the job's new pass, whose actors are up
already). Readiness is Ray Data's own timing of the vLLM stage (:func:`engine_ready`): the start of its first
batch, which an actor runs once its constructor, the engine's start, has returned. Rows cannot give it: Ray Data
emits them in whole batches, and an engine holds several batches at once.
Rows are written as Parquet (entity, knowledge, tokens, error) under ``--out``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipelines.workers.layout import with_layout

log = logging.getLogger(__name__)

SPECULATION = ("none", "ngram", "suffix")
DRAFT_TOKENS = 8  # num_speculative_tokens of the ngram / suffix rows: the job's vLLM drafter's MAX_DRAFT
KV_CACHE_GIB = 2  # as the job's vLLM workers (laser.vllm.VllmEngine's default)
MAX_MODEL_LEN = 2048  # as the job's vLLM workers
SUMMARY = "summary.json"
VLLM_STAGE = "vLLMEngineStageUDF"  # in the name of Ray Data's vLLM operator: MapBatches(vLLMEngineStageUDF)


def speculative_config(speculation: str) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a row: none, prompt lookup (n 2-4) or Arctic Inference's suffix."""
    if speculation == "none":
        return None
    if speculation == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": DRAFT_TOKENS,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    if speculation == "suffix":
        return {"method": "suffix", "num_speculative_tokens": DRAFT_TOKENS}
    raise ValueError(f"speculation must be one of {list(SPECULATION)}, got {speculation!r}")


def job_prompts(cfg: Any, tokenizer: Any) -> dict[str, list[dict[str, Any]]]:
    """The job's two passes as rows: {"old": [...], "new": [...]}, each row with entity_type, entity_id,
    tokenized_prompt (the ids the job's workers would feed the model), max_tokens and rule_params (the
    rules of the job's first text for it, genre ban included, as vLLM ``SamplingParams`` keywords).

    A request whose prompt cannot be made (too long, no title) is left out and listed under "failed"."""
    from laser.models import chat_ids
    from laser.vllm.forms import rule_params
    from pipelines.knowledge.decoders import new_knowledge_decoder, old_knowledge_decoder
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.job import knowledge_task
    from pipelines.knowledge.prompts import entity_prompt
    from pipelines.knowledge.requests import new_requests, old_requests
    from pipelines.knowledge.retry import GenreBan, first_rules

    data = load_job_data(cfg)
    domain = data.dataset.domain
    ban = GenreBan(tokenizer)
    tasks = {
        "old": knowledge_task(cfg, old_knowledge_decoder(cfg), "ray-data-llm-old", domain, None, greedy=True),
        "new": knowledge_task(cfg, new_knowledge_decoder(cfg), "ray-data-llm", domain, None),
    }
    requests = {
        "old": old_requests(data.dataset, data.split) if cfg.old_knowledge.generate_missing else [],
        "new": new_requests(data.dataset, data.split, {}),
    }  # routes only name pools; prompts are the same
    out: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "failed": []}
    for name in ("old", "new"):
        task = tasks[name]
        for req in requests[name]:
            try:
                ids = chat_ids(tokenizer, entity_prompt(task, req, tokenizer))
            except Exception as exc:  # as in the job: one bad entity never takes down the others
                out["failed"].append(
                    {
                        "pass": name,
                        "entity_type": req.entity_type,
                        "entity_id": req.entity_id,
                        "reason": f"{type(exc).__name__}: {exc}",
                    }
                )
                continue
            out[name].append(
                {
                    "entity_type": req.entity_type,
                    "entity_id": req.entity_id,
                    "tokenized_prompt": ids,
                    "max_tokens": task.max_new_tokens,
                    "rule_params": rule_params(_plain(first_rules(task, req, ban)), tokenizer),
                }
            )
    return out


def _plain(rules: Mapping[str, object] | None) -> dict[str, Any] | None:
    """A task's rules as the plain dict that ``rule_params`` takes."""
    return None if rules is None else dict(rules)


def sampling_params(row: dict[str, Any]) -> dict[str, Any]:
    """Greedy, the row's token budget and its first text's generation rules in their vLLM form."""
    return {
        "max_tokens": int(row["max_tokens"]),
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "detokenize": True,
        **row["rule_params"],
    }


def engine_env(threads: int) -> dict[str, str]:
    """What every vLLM engine of the row reads at start, as the job's vLLM workers have it
    (:func:`laser.vllm.env.vllm_env`: threads with placement left to the OS, KV cache size, and on CPU
    the compiled model reused from torch inductor's cache instead of compiled at every start); compile
    caches are inherited from this process's environment. vLLM's engine core keeps its own process."""
    from laser.vllm.env import vllm_env

    env = vllm_env(threads, KV_CACHE_GIB, in_process=False, bind=False)
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "LASER_CACHE_DIR", "HF_HUB_OFFLINE"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def processor_config(cfg: Any, model_path: str, speculation: str) -> Any:
    """The ``vLLMEngineProcessorConfig`` of the row (module docstring: resources and the CPU settings)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    from laser.vllm.env import default_block_size

    ex = cfg.execution
    slots = max(int(ex.batch_size), 1)
    spec = speculative_config(speculation)
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else "float32"
    engine_kwargs = {
        "dtype": dtype,
        "seed": cfg.dataset.seed,
        "enable_prefix_caching": True,
        "max_num_seqs": slots,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": max(2048, slots * ((DRAFT_TOKENS if spec else 0) + 1)),
    }
    if spec:
        engine_kwargs["speculative_config"] = spec
    if (block := default_block_size()) is not None:
        engine_kwargs["block_size"] = block
    return vLLMEngineProcessorConfig(
        model_source=model_path,
        engine_kwargs=engine_kwargs,
        batch_size=slots,
        concurrency=(int(ex.num_workers), int(ex.num_workers)),  # a fixed pool, as the job's (an int autoscales from 1)
        placement_group_config={"bundles": [{"CPU": int(ex.threads_per_worker)}]},
        log_engine_metrics=False,
        chat_template_stage=False,
        tokenize_stage=False,
        detokenize_stage=False,
        runtime_env={"env_vars": engine_env(int(ex.threads_per_worker))},
    )


def run_pass(processor: Any, cfg: Any, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One Ray Data execution over ``rows``; returns the generated rows and the pass's figures."""
    import ray

    start = time.perf_counter()
    if not rows:
        return [], pass_figures([], [], 0.0, None)
    items = [
        {
            "entity_type": r["entity_type"],
            "entity_id": r["entity_id"],
            "tokenized_prompt": r["tokenized_prompt"],
            "sampling_params": sampling_params(r),
        }
        for r in rows
    ]
    ds = processor(ray.data.from_items(items))
    got: list[dict[str, Any]] = []
    arrivals: list[tuple[float, str]] = []
    for row in ds.iter_rows():
        arrivals.append((time.perf_counter() - start, str(row.get("batch_uuid") or len(got))))
        got.append(
            {
                "entity_type": row["entity_type"],
                "entity_id": row["entity_id"],
                "knowledge": row.get("generated_text") or "",
                "n_tokens": int(row.get("num_generated_tokens") or 0),
                "error": row.get("__inference_error__") or "",
            }
        )
    wall = time.perf_counter() - start
    ready = engine_ready(ds._get_stats_summary())  # the actors' perf_counter: one clock with ours on local Ray
    return got, pass_figures(got, arrivals, wall, None if ready is None else ready - start)


def engine_ready(summary: Any, stage: str = VLLM_STAGE) -> float | None:
    """When the first engine of the pass was ready (``time.perf_counter`` of the machine): the earliest start of
    a batch in Ray Data's ``stage`` operator, from the executed dataset's stats summary (``ds._get_stats_summary()``,
    its ``operators_stats`` and their ``parents``). An actor starts a batch only after its constructor (the
    engine's start) returned. None when no such operator ran a batch."""
    starts = [
        op.earliest_start_time
        for op in _operators(summary)
        if stage in op.operator_name and op.earliest_start_time is not None
    ]
    return min(starts) if starts else None


def _operators(summary: Any) -> Iterator[Any]:
    yield from summary.operators_stats
    for parent in summary.parents:
        yield from _operators(parent)


def pass_figures(
    got: list[dict[str, Any]], arrivals: list[tuple[float, str]], wall: float, engine_ready_s: float | None
) -> dict[str, Any]:
    """Entities, wall seconds, tokens and rates of one pass. ``arrivals``: (seconds since the pass began, vLLM
    batch) per row in arrival order. ``engine_ready_s``: seconds from the pass's start to its first engine's
    readiness (:func:`engine_ready`). ``running_entities_per_min``: the entities over the seconds from then to
    the pass's end; None without a readiness inside the pass."""
    failed = sum(1 for g in got if g["error"])
    done = len(got) - failed
    tokens = sum(g["n_tokens"] for g in got)
    batches = {batch for _, batch in arrivals}
    running = None
    if engine_ready_s is not None and 0 <= engine_ready_s < wall:
        running = 60 * done / (wall - engine_ready_s)
    return {
        "entities": done,
        "failed": failed,
        "wall_s": wall,
        "tokens": tokens,
        "entities_per_min": 60 * done / wall if wall else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "first_row_s": arrivals[0][0] if arrivals else None,
        "engine_ready_s": engine_ready_s,
        "batches": len(batches),
        "running_entities_per_min": running,
        "aal": None,
    }


def run(cfg: Any, out: Path, speculation: str = "none", t0: float | None = None) -> dict[str, Any]:
    """The whole Ray Data LLM pipeline for the job config ``cfg`` (a ``JobConfig``); writes
    ``out/summary.json`` and the rows. ``t0``: when the process started (its config load counts)."""
    from laser.models import model_dir

    t0 = time.perf_counter() if t0 is None else t0
    cfg = with_layout(cfg)  # the job's actor layout, so both rows run the same engines
    ex = cfg.execution
    if cfg.generation.sampling().get("temperature", 0) not in (0, 0.0, None):
        log.warning("the job samples (generation.temperature > 0); this row decodes greedily")
    model_path = model_dir(cfg.model.name)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = job_prompts(cfg, tokenizer)
    t_prompts = time.perf_counter() - t0
    os.environ.update(engine_env(int(ex.threads_per_worker)))
    import ray
    from ray.data.llm import build_processor

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ray.init(
        num_cpus=int(ex.num_workers) * int(ex.threads_per_worker),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": engine_env(int(ex.threads_per_worker))},
    )
    processor = build_processor(
        processor_config(cfg, model_path, speculation),
        preprocess_map_kwargs={"num_cpus": 0},
        postprocess_map_kwargs={"num_cpus": 0},
    )
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "speculation": speculation,
        "model": model_path,
        "prompts_s": t_prompts,
        "prompt_failures": prompts["failed"],
    }
    for name in ("old", "new"):
        log.info("ray data llm: %s pass, %d entities", name, len(prompts[name]))
        rows, figures = run_pass(processor, cfg, prompts[name])
        figures["failed"] += sum(1 for f in prompts["failed"] if f["pass"] == name)
        summary[name] = figures
        _write_rows(out / f"{name}_knowledge.parquet", rows)
    summary["wall_s_in_process"] = time.perf_counter() - t0
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))
    ray.shutdown()
    return summary


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    import polars as pl

    schema = {
        "entity_type": pl.Utf8,
        "entity_id": pl.Utf8,
        "knowledge": pl.Utf8,
        "n_tokens": pl.Int64,
        "error": pl.Utf8,
    }
    pl.DataFrame(rows, schema=schema).write_parquet(path)
