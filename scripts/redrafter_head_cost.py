"""Cost of one ReDrafter head beam step against one target decoding step on this machine (CPU, fp32)."""

import json
import sys
import time

import torch

import laser
from laser.decoders.redrafter.head import RecurrentDraftHead


def best_of(fn, n=30):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


@torch.no_grad()
def main(threads: int = 1) -> None:
    torch.set_num_threads(threads)
    lm = laser.load_model(laser.DEFAULT_MODEL, device="cpu", dtype="float32")
    model, d = lm.model, lm.model.config.hidden_size
    prompt = torch.randint(0, 1000, (1, 300))
    out = model(prompt, use_cache=True)
    cache = out.past_key_values

    def target_step(n):
        ids = torch.randint(0, 1000, (1, n))
        model(ids, past_key_values=cache, use_cache=True)
        cache.crop(-n)

    rows = {"target_step_ms": {n: best_of(lambda: target_step(n)) for n in (1, 8, 16, 32)}}
    shortlist = torch.arange(4096)
    for kind in ("full", "tied", "shortlist"):
        head = RecurrentDraftHead(model, kind, shortlist=shortlist if kind == "shortlist" else None).eval()
        for bw in (1, 4, 8):
            h, s = torch.randn(bw, d), torch.randn(bw, d)
            tok = torch.randint(0, 1000, (bw,))
            step = lambda: head.logits(h, head.advance(s, tok)).log_softmax(-1).topk(bw)  # noqa: E731
            rows[f"{kind}_bw{bw}_ms"] = best_of(step)
    rows["threads"] = threads
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
