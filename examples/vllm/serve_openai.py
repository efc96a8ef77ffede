"""LASER behind a team's own ``vllm serve``, called with the ``openai`` client (docs/vllm-dropin.md).

Start the server with LASER as its drafter (the JSON is ``laser.vllm.speculative_config(4)``), saying where
the pool stores requests may name lie (none opens elsewhere)::

    LASER_POOL_ROOTS=/srv/pools vllm serve MODEL --speculative-config \
        '{"method": "custom_class", "model": "laser.vllm.proposer.LaserProposer", "num_speculative_tokens": 4}'

then::

    python examples/vllm/serve_openai.py --model MODEL --pool-store POOLS --pool KEY [--relaxed] [--url URL]

Each request names its pool in ``extra_body={"vllm_xargs": laser.vllm.request_args(...)}``. ``POOLS`` is a
pool store written by ``laser pools build`` with MODEL's tokenizer, on a path the server can read. Greedy
answers are plain vLLM's; ``--relaxed`` accepts a draft token in the target's top-2 with probability above
0.1. Prints each answer, then the draft tokens the server verified and accepted so far (its /metrics).
"""

from __future__ import annotations

import argparse
import re
import urllib.request

import laser.vllm

PROMPTS = [
    "In two sentences, describe a user who rated Alien, Blade Runner and The Terminator highly.",
    "In two sentences, describe the film Heat (1995) for a recommender system.",
]


def spec_counts(url: str) -> dict[str, float]:
    """The server's draft and accepted token counters (Prometheus text at /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics") as resp:  # noqa: S310 - the user's server
        text = resp.read().decode()
    counts = {"draft": 0.0, "accepted": 0.0}
    for m in re.finditer(r"^vllm:spec_decode_num_(draft|accepted)_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M):
        counts[m.group(1)] += float(m.group(2))
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the model the server serves (its name or path)")
    ap.add_argument("--pool-store", required=True, help="a pool store directory (laser pools build)")
    ap.add_argument("--pool", required=True, help="the key of the pool every request drafts from")
    ap.add_argument("--url", default="http://localhost:8000", help="the server")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--relaxed", action="store_true", help="relaxed verification, k=2 and p=0.1")
    args = ap.parse_args(argv)

    from openai import OpenAI

    client = OpenAI(base_url=f"{args.url}/v1", api_key="unused")
    rule = {"k": 2, "p": 0.1} if args.relaxed else {}
    xargs = laser.vllm.request_args(pool=args.pool, pool_store=args.pool_store, **rule)
    for prompt in PROMPTS:
        resp = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=args.max_tokens,
            temperature=0,
            extra_body={"vllm_xargs": xargs},
        )
        print((resp.choices[0].message.content or "").strip(), end="\n\n")
    counts = spec_counts(args.url)
    print(f"server so far: drafted {counts['draft']:.0f} tokens, accepted {counts['accepted']:.0f}")


if __name__ == "__main__":
    main()
