"""LASER as the drafter of a team's own Ray Data LLM pipeline (docs/vllm-dropin.md).

    python examples/vllm/ray_data_llm.py --model MODEL --pool-store POOLS --pool KEY [--relaxed] [--cpu]

Two additions to an ordinary ``ray.data.llm`` pipeline: the engine gets LASER as its drafter through
``engine_kwargs["speculative_config"]``, and each row names the pool it drafts from in its
``sampling_params["extra_args"]`` (here every row uses ``--pool``; a real pipeline gives each row its
entity's routed pool). ``POOLS`` is a pool store written by ``laser pools build`` or the knowledge job with
MODEL's tokenizer, on a path the engines can read and inside ``LASER_POOL_ROOTS`` of their environment
(set here through the stage's ``runtime_env``). Greedy rows decode exactly as plain vLLM would;
``--relaxed`` accepts a draft token in the target's top-2 with probability above 0.1.
"""

from __future__ import annotations

import argparse
from typing import Any

import laser.vllm

MAX_DRAFT = 4  # draft tokens a step at most
PROMPTS = [
    "In two sentences, describe a user who rated Alien, Blade Runner and The Terminator highly.",
    "In two sentences, describe a user who rated Toy Story, Aladdin and The Lion King highly.",
    "In two sentences, describe the film Heat (1995) for a recommender system.",
]


def processor_config(model: str, laser_drafts: bool = True, cpu: bool = False, **config: Any) -> Any:
    """The ``vLLMEngineProcessorConfig``: LASER in ``engine_kwargs`` (``laser_drafts=False``: plain vLLM).
    ``cpu``: the two settings vLLM's CPU build needs under Ray Data (CPU bundles, else the stage waits for a
    GPU; no Prometheus stat logger, else the engine actor dies). ``config``: more of its fields
    (``engine_kwargs`` entries are merged)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    engine_kwargs = {"max_model_len": 2048, **config.pop("engine_kwargs", {})}
    if laser_drafts:
        engine_kwargs["speculative_config"] = laser.vllm.speculative_config(MAX_DRAFT)
    if cpu:
        config = {"placement_group_config": {"bundles": [{"CPU": 1}]}, "log_engine_metrics": False, **config}
    return vLLMEngineProcessorConfig(
        model_source=model, engine_kwargs=engine_kwargs, batch_size=16, concurrency=1, **config
    )


def sampling_params(max_tokens: int, **laser_args: Any) -> dict[str, Any]:
    """A row's ``sampling_params``: greedy, with its LASER arguments (``laser.vllm.request_args``: ``pool``,
    ``pool_store``, ``k`` and ``p`` for the relaxed rule, ...)."""
    return {"temperature": 0.0, "max_tokens": max_tokens, "extra_args": laser.vllm.request_args(**laser_args)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model id or folder")
    ap.add_argument("--pool-store", required=True, help="a pool store directory (laser pools build)")
    ap.add_argument("--pool", required=True, help="the key of the pool every row drafts from")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--relaxed", action="store_true", help="relaxed verification, k=2 and p=0.1")
    ap.add_argument("--cpu", action="store_true", help="vLLM's CPU build")
    args = ap.parse_args(argv)

    import ray
    from ray.data.llm import build_processor

    rule = {"k": 2, "p": 0.1} if args.relaxed else {}
    params = sampling_params(args.max_tokens, pool=args.pool, pool_store=args.pool_store, **rule)
    roots = {"env_vars": {"LASER_POOL_ROOTS": args.pool_store}}  # the engines open stores only there
    processor = build_processor(
        processor_config(args.model, cpu=args.cpu, runtime_env=roots),
        preprocess=lambda row: {
            "id": row["id"],
            "messages": [{"role": "user", "content": row["text"]}],
            "sampling_params": params,
        },
        postprocess=lambda row: {"id": row["id"], "knowledge": row["generated_text"]},
    )
    ds = processor(ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(PROMPTS)]))
    for row in sorted(ds.take_all(), key=lambda r: r["id"]):
        print(f"{row['id']}: {row['knowledge']}")


if __name__ == "__main__":
    main()
