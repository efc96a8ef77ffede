"""LASER in a team's own vLLM (docs/vllm-dropin.md): ``LLM(..., speculative_config=speculative_config(4))`` and
``vllm serve --speculative-config ...`` with per-request ``request_args``, against plain vLLM.

vLLM runs with its defaults here (engine core in its own process), as a team would run it. Three engine
starts in all: plain vLLM makes the reference in a fresh interpreter (this file's ``__main__ ref``) and
the pool store; the offline ``LLM`` runs in another (``__main__ offline``); ``vllm serve`` is a real
server on a free localhost port, called with the ``openai`` client from the test process. Drafts and
accepts are counted from vLLM's own spec-decoding metrics (``LLM.get_metrics()``, the server's /metrics).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fuzz_server import laser_server

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
NEW = 32  # tokens per answer
N_PROMPTS = 8
MAX_DRAFT = 4
ROUNDS = 12  # deviations sought per text
P_MIN = 0.11  # a deviation of the "wrong" texts: the target's second choice, with at least this probability
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
DRAFTED, ACCEPTED = "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"


def _env(pool_root: str | Path) -> dict[str, str]:
    """vLLM's CPU environment (1 thread, 1 GiB of KV cache), engine core in its own process (vLLM's default);
    request pool stores may lie under ``pool_root``."""
    from laser.vllm import vllm_env

    env = {**os.environ, **vllm_env(threads=1, kv_cache_gib=1, in_process=False), "LASER_POOL_ROOTS": str(pool_root)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run_main(*args: str, timeout: int = 800) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_env(args[1])
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("REPORT ") :])


# the fresh interpreters ----------------------------------------------------------------------------------


def _prompts() -> list[list[int]]:
    import random

    rng = random.Random(5)
    return [[0] + [rng.randrange(2, 250) for _ in range(rng.randrange(6, 20))] for _ in range(N_PROMPTS)]


def _second(logprobs: dict, chosen: int) -> tuple[int, float] | None:
    """The runner-up of one position's top-2 logprobs (token, probability), or None."""
    import math

    others = [(t, math.exp(lp.logprob)) for t, lp in logprobs.items() if t != chosen]
    return max(others, key=lambda x: x[1]) if others else None


def _main_ref(workdir: Path) -> dict:
    """Plain vLLM: the greedy reference, then texts a relaxed rule (k=2, p=0.1) would follow and greedy would
    not (up to ROUNDS deviations, each the target's second choice with probability > P_MIN, each continued
    greedily); the pool store holds the reference ("good") and each prompt's text ("wrong/<i>")."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from pools.store import TokenizerFingerprint, write_store
    from tests.helpers import save_tiny_model

    model = save_tiny_model(workdir / "tiny", hidden_size=128)
    llm = LLM(str(model), **ENGINE)
    prompts = _prompts()

    def greedy(contexts: list[list[int]], n: list[int]) -> list:
        params = [SamplingParams(temperature=0, max_tokens=k, logprobs=2, ignore_eos=True) for k in n]
        return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": c} for c in contexts], params)]

    ref = [list(o.token_ids) for o in greedy(prompts, [NEW] * N_PROMPTS)]
    wrong: list[list[int]] = [[] for _ in prompts]
    deviations = 0
    for _ in range(ROUNDS):
        rows = [i for i in range(N_PROMPTS) if len(wrong[i]) < NEW - 1]
        outs = greedy([prompts[i] + wrong[i] for i in rows], [NEW - len(wrong[i]) for i in rows])
        for i, out in zip(rows, outs):
            found = [
                (j, alt[0])
                for j, (tok, lps) in enumerate(zip(out.token_ids, out.logprobs))
                if (alt := _second(lps, tok)) is not None and alt[1] > P_MIN
            ]
            j, alt_tok = found[0] if found else (len(out.token_ids), None)
            wrong[i] += list(out.token_ids[:j]) + ([alt_tok] if alt_tok is not None else [])
            deviations += alt_tok is not None
    rows = [i for i in range(N_PROMPTS) if len(wrong[i]) < NEW]
    if rows:
        outs = greedy([prompts[i] + wrong[i] for i in rows], [NEW - len(wrong[i]) for i in rows])
        for i, out in zip(rows, outs):
            wrong[i] += list(out.token_ids)
    tok = AutoTokenizer.from_pretrained(str(model))
    pools = {"good": ref, **{f"wrong/{i}": [w] for i, w in enumerate(wrong)}}
    write_store(workdir / "pools", pools, TokenizerFingerprint.of(tok))
    report = {"model": str(model), "prompts": prompts, "ref": ref, "wrong": wrong, "deviations": deviations}
    report["ref_text"] = [tok.decode(r) for r in ref]
    (workdir / "ref.json").write_text(json.dumps(report))
    return report


def _counts(llm) -> dict[str, float]:
    return {m.name: float(m.value) for m in llm.get_metrics() if m.name in (DRAFTED, ACCEPTED)}


def _main_offline(workdir: Path) -> dict:
    """A team's own ``LLM`` with LASER as its drafter: each run's tokens and its drafted/accepted counts."""
    from vllm import LLM, SamplingParams

    import laser.vllm

    ref = json.loads((workdir / "ref.json").read_text())
    store = str(workdir / "pools")
    llm = LLM(
        ref["model"], speculative_config=laser.vllm.speculative_config(MAX_DRAFT), disable_log_stats=False, **ENGINE
    )
    inputs = [{"prompt_token_ids": p} for p in ref["prompts"]]
    report: dict = {}

    def run(name: str, args: list[dict[str, str]]) -> None:
        before = _counts(llm)
        params = [SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, extra_args=a) for a in args]
        outs = llm.generate(inputs, params)
        after = _counts(llm)
        report[name] = {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "drafted": after.get(DRAFTED, 0) - before.get(DRAFTED, 0),
            "accepted": after.get(ACCEPTED, 0) - before.get(ACCEPTED, 0),
        }

    def each(pool: str | None, **kw: object) -> list[dict[str, str]]:
        return [
            laser.vllm.request_args(pool=pool or f"wrong/{i}", pool_store=store, draft_len=MAX_DRAFT, **kw)
            for i in range(N_PROMPTS)
        ]

    run("good", each("good"))
    run("wrong", each(None))
    run("relaxed", each(None, k=2, p=0.1))
    run("off", [laser.vllm.request_args(draft=False)] * N_PROMPTS)
    try:  # k without p, as a hand-written request could send it
        llm.generate(inputs[:1], SamplingParams(temperature=0, max_tokens=4, extra_args={"laser": '{"v":1,"k":2}'}))
        report["malformed"] = None
    except Exception as exc:  # noqa: BLE001 - what vLLM raises is the finding
        report["malformed"] = f"{type(exc).__name__}: {exc}"
    try:
        run("after_malformed", each("good"))
    except Exception as exc:  # noqa: BLE001
        report["after_malformed"] = {"error": f"{type(exc).__name__}: {exc}"}
    return report


# the tests -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("dropin")
    report = _run_main("ref", str(workdir))
    assert report["deviations"] >= N_PROMPTS, "too few runner-up tokens above P_MIN for a relaxed test"
    return workdir, report


@pytest.mark.slow
def test_offline_llm_greedy_identical_and_relaxed_accepts_more(reference):
    workdir, ref = reference
    got = _run_main("offline", str(workdir))
    good, wrong, relaxed, off = (got[k] for k in ("good", "wrong", "relaxed", "off"))
    assert good["tokens"] == ref["ref"] and wrong["tokens"] == ref["ref"]  # greedy LASER is plain vLLM
    assert off["tokens"] == ref["ref"] and off["drafted"] == 0
    assert good["accepted"] >= 0.5 * N_PROMPTS * NEW  # drafts from the answers themselves: most accepted
    # relaxed takes the runner-ups greedy refuses: more drafts accepted, at a higher rate (fewer steps, so
    # fewer drafted in all)
    assert relaxed["accepted"] > wrong["accepted"]
    assert relaxed["accepted"] / relaxed["drafted"] > wrong["accepted"] / wrong["drafted"]
    assert relaxed["tokens"] != ref["ref"]  # relaxed took runner-ups greedy refused
    assert got["malformed"] is not None and "k and p go together" in got["malformed"]  # refused to the caller
    assert got["after_malformed"].get("tokens") == ref["ref"]  # the engine survived the bad request


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - localhost
        return resp.read().decode()


def _server_counts(url: str) -> dict[str, float]:
    """Drafted and accepted tokens so far, from the server's Prometheus /metrics."""
    found = {DRAFTED: 0.0, ACCEPTED: 0.0}
    for line in _get(f"{url}/metrics").splitlines():
        m = re.match(r"(vllm:spec_decode_num_(?:draft|accepted)_tokens)_total(?:\{[^}]*\})? (\S+)$", line)
        if m:
            found[m.group(1)] += float(m.group(2))
    return found


@pytest.mark.slow
def test_vllm_serve_with_the_openai_client(reference):
    """A real ``vllm serve`` with LASER's speculative config; requests carry ``request_args`` in
    ``vllm_xargs``: greedy is plain vLLM's tokens, drafts are accepted (the server's /metrics), and a
    malformed argument is a 400 naming the problem while the server keeps serving."""
    import openai

    import laser.vllm

    workdir, ref = reference
    with laser_server(Path(ref["model"]), _env(workdir), workdir / "serve.log", timeout_s=700) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)

        def complete(xargs: dict[str, str]) -> list[list[int]]:
            resp = client.completions.create(
                model=ref["model"],
                prompt=ref["prompts"],
                max_tokens=NEW,
                temperature=0,
                extra_body={"vllm_xargs": xargs, "return_token_ids": True, "ignore_eos": True},
            )
            return [c.model_dump()["token_ids"] for c in sorted(resp.choices, key=lambda c: c.index)]

        store = str(workdir / "pools")
        before = _server_counts(url)
        got = complete(laser.vllm.request_args(pool="good", pool_store=store, draft_len=MAX_DRAFT))
        after = _server_counts(url)
        assert got == ref["ref"]  # greedy LASER through the server is plain vLLM's tokens
        assert after[ACCEPTED] - before[ACCEPTED] >= 0.5 * N_PROMPTS * NEW
        with pytest.raises(openai.BadRequestError, match="k and p go together"):
            complete({"laser": '{"v":1,"k":2}'})  # hand-written, not through request_args
        with pytest.raises(openai.BadRequestError, match="unknown LASER argument"):
            complete({"laser": '{"v":1,"pool":"good","pools":"x"}'})
        assert complete(laser.vllm.request_args(draft=False)) == ref["ref"]  # still serving


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    mode, folder = sys.argv[1], Path(sys.argv[2])
    result = {"ref": _main_ref, "offline": _main_offline}[mode](folder)
    print("REPORT " + json.dumps(result))
