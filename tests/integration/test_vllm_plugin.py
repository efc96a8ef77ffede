"""LASER in vLLM with the engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1): the engine
process opens pools from the pool store path each request carries, and each request's draft length holds
there; per-request stats come back through vLLM's spec-decoding metrics. Runs in a fresh interpreter (vLLM
caches its environment once an in-process engine ran in the test process), built by this file's ``__main__``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

NEW = 32


def _main(workdir: str) -> None:
    import torch
    from transformers import AutoTokenizer

    from laser.vllm import VllmEngine
    from pools.retrieval import RetrievalPool
    from pools.store import TokenizerFingerprint, write_store
    from tests.helpers import save_tiny_model

    model = save_tiny_model(Path(workdir) / "tiny", hidden_size=128)
    g = torch.Generator().manual_seed(3)
    prompts = [
        [0] + torch.randint(2, 250, (int(torch.randint(4, 24, (1,), generator=g)),), generator=g).tolist()
        for _ in range(4)
    ]
    eng = VllmEngine(
        str(model),
        speculation="laser",
        max_draft=4,
        draft_len=4,
        threads=1,
        max_num_seqs=8,
        max_model_len=512,
        kv_cache_gib=1,
        enforce_eager=True,
        in_process=False,
        per_request_spec_decode_metrics="detailed",
        pool_roots=[workdir],  # the engine core opens no store outside its roots
    )
    try:
        report = {"proposer_in_caller": eng.proposer is not None}
        ref = [o.token_ids for o in eng.generate(prompts, NEW, draft=False)]
        store = Path(workdir) / "pools"
        write_store(
            store,
            {"user/good": ref, "user/wrong": [[(t * 7 + 3) % 250 + 2 for t in r] for r in ref]},
            TokenizerFingerprint.of(AutoTokenizer.from_pretrained(str(model))),
        )
        runs = {}
        for key in ("user/good", "user/wrong", "user/missing"):
            outs = eng.generate(prompts, NEW, pool_keys=[key] * 4, pool_store=store)
            runs[key] = {
                "same": [o.token_ids for o in outs] == ref,
                "accepted": sum(o.accepted_tokens for o in outs),
                "drafted": sum(o.drafted_tokens or 0 for o in outs),
                "per_step": [o.accepted_per_step for o in outs],
                "forwards": [o.target_forwards for o in outs],
            }
        eng.set_draft_len(1)  # carried by each request into the engine process
        outs = eng.generate(prompts, NEW, pool_keys=["user/good"] * 4, pool_store=store)
        runs["len1"] = {
            "same": [o.token_ids for o in outs] == ref,
            "drafted": sum(o.drafted_tokens or 0 for o in outs),
            "per_step": [o.accepted_per_step for o in outs],
        }
        eng.set_draft_len("auto")  # the budget there, on the step-cost table sent through the environment
        outs = eng.generate(prompts, NEW, pool_keys=["user/good"] * 4, pool_store=store)
        runs["auto"] = {"same": [o.token_ids for o in outs] == ref}
        report["runs"] = runs
        try:
            eng.register_pool("x", RetrievalPool.from_token_ids(ref))
            report["register_refused"] = False
        except RuntimeError:
            report["register_refused"] = True
    finally:
        eng.close()
    print("REPORT " + json.dumps(report))


@pytest.mark.slow
def test_multiprocess_engine_core_drafts_from_the_pool_store(tmp_path):
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=800,
        cwd=Path(__file__).resolve().parents[2],
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    report = json.loads(lines[-1][len("REPORT ") :])
    assert report["proposer_in_caller"] is False  # the proposer lives in vLLM's engine process
    assert report["register_refused"] is True
    good, wrong, missing = (report["runs"][k] for k in ("user/good", "user/wrong", "user/missing"))
    assert good["same"] and wrong["same"] and missing["same"]  # greedy is lossless whatever the pool
    assert good["accepted"] > 0 and good["drafted"] > 0  # drafted from the store, stats from vLLM's metrics
    assert all(sum(s) <= NEW for s in good["per_step"])
    assert wrong["drafted"] > 0 and wrong["accepted"] < good["accepted"]
    assert missing["drafted"] == 0  # an unknown key drafts nothing (counted and logged in the engine process)
    len1 = report["runs"]["len1"]  # a draft length set here holds in the engine process
    assert len1["same"] and len1["drafted"] > 0 and max(max(s, default=0) for s in len1["per_step"]) == 1
    assert report["runs"]["auto"]["same"]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _main(sys.argv[1])
