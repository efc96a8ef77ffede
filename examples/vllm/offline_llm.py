"""LASER as the drafter of a team's own offline ``vllm.LLM`` (docs/vllm-dropin.md).

    python examples/vllm/offline_llm.py --model MODEL --pool-store POOLS --pool KEY [--relaxed]

Two additions to an ordinary ``LLM(...)`` script: ``speculative_config=laser.vllm.speculative_config(...)``
makes LASER the engine's drafter, and each request's ``SamplingParams(extra_args=laser.vllm.request_args(...))``
names the pool it drafts from (here every prompt uses ``--pool``; a real job gives each request its entity's
pool). ``POOLS`` is a pool store written by ``laser pools build`` with MODEL's tokenizer; the engine opens
stores only inside the roots its owner lets in (``laser.vllm.add_pool_roots``, or ``LASER_POOL_ROOTS``). Greedy decodes
exactly as plain vLLM; ``--relaxed`` accepts a draft token in the target's top-2 with probability above 0.1.
Prints each answer, then the draft tokens vLLM verified and accepted (its own spec-decoding counters).
"""

from __future__ import annotations

import argparse

import laser.vllm

MAX_DRAFT = 4  # draft tokens a step at most
PROMPTS = [
    "In two sentences, describe a user who rated Alien, Blade Runner and The Terminator highly.",
    "In two sentences, describe a user who rated Toy Story, Aladdin and The Lion King highly.",
    "In two sentences, describe the film Heat (1995) for a recommender system.",
]
COUNTERS = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model id or folder")
    ap.add_argument("--pool-store", required=True, help="a pool store directory (laser pools build)")
    ap.add_argument("--pool", required=True, help="the key of the pool every prompt drafts from")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--relaxed", action="store_true", help="relaxed verification, k=2 and p=0.1")
    args = ap.parse_args(argv)

    from vllm import LLM, SamplingParams

    laser.vllm.add_pool_roots([args.pool_store])  # before the engine starts: its core opens stores only there
    llm = LLM(
        args.model,
        speculative_config=laser.vllm.speculative_config(MAX_DRAFT),
        disable_log_stats=False,  # keeps the spec-decoding counters printed below
        max_model_len=2048,
    )
    rule = {"k": 2, "p": 0.1} if args.relaxed else {}
    params = SamplingParams(
        temperature=0,
        max_tokens=args.max_tokens,
        extra_args=laser.vllm.request_args(pool=args.pool, pool_store=args.pool_store, **rule),
    )
    for out in llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params, use_tqdm=False):
        print(out.outputs[0].text.strip(), end="\n\n")
    counts = {m.name: m.value for m in llm.get_metrics() if m.name in COUNTERS}
    print(f"drafted {counts.get(COUNTERS[0], 0):.0f} tokens, accepted {counts.get(COUNTERS[1], 0):.0f}")


if __name__ == "__main__":
    main()
