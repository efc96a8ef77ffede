"""`laser bench throughput` end to end on a tiny model: every method at every concurrency, the targets,
the ceiling, and the JSON, Markdown and PNG outputs; `--engine vllm` on a tiny model (medians and spreads of
interleaved repeats, the proposer's columns) and a SIGTERM to it stopping its level processes."""

from __future__ import annotations

import json

import pytest

from benchmarks.throughput import GENERATE, ThroughputSettings, ceiling, run_throughput
from laser.cost import ForwardCost


def test_ceiling_is_the_best_per_token_time():
    cost = ForwardCost("k", [1, 4], [1, 8], [[0.02, 0.04], [0.03, 0.16]])
    ce = ceiling(cost, prompt_tokens=90, new_tokens=10)
    assert ce["best_seconds_per_token"] == pytest.approx(0.16 / 32)
    assert ce["tokens_per_s_with_prefill"] == pytest.approx(10 / (100 * 0.005))
    assert ce["decode_tokens_per_s"] == pytest.approx(200)


@pytest.mark.slow
def test_throughput_bench_on_a_tiny_model(tiny_model, tmp_path):
    settings = ThroughputSettings(
        model=tiny_model, threads=1, concurrency=(1, 3), min_prompts=3, max_new_tokens=8, old_users=8, fixed_K=(4,)
    )
    out = tmp_path / "tp.json"
    report = run_throughput(out, settings, cache_root=tmp_path / "fixtures")
    assert set(report["levels"]) == {"1", "3"}
    for level in report["levels"].values():
        assert level[GENERATE]["speedup_vs_generate"] == pytest.approx(1.0)
        for name, m in level.items():
            assert m["tokens"] > 0 and m["prompts"] == 3 and m["decode_tokens_per_s"] >= m["tokens_per_s"] > 0
            if name != GENERATE:
                assert m["aal"] >= 1.0 and 0.0 <= m["rejected_draft_share"] <= 1.0
                assert m["efficiency_vs_cost_model"] > 0
    assert report["levels"]["3"]["autoregressive"]["mean_rows"] <= 3
    assert {t["target"] for t in report["targets"]} >= {"relaxed LASER (auto) never below generate"}
    saved = json.loads(out.read_text())
    assert saved["best"].keys() == report["levels"]["1"].keys()
    assert out.with_suffix(".png").stat().st_size > 0 and "| method |" in out.with_suffix(".md").read_text()


# ---- `laser bench throughput --engine vllm` ------------------------------------------------------------
def _vllm_tiny(tmp_path_factory) -> str:
    pytest.importorskip("vllm")
    from tests.helpers import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("vllm-bench") / "tiny", hidden_size=128))


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (psutil when installed, else /proc)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - the process is gone
        return []
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _bench_command(model: str, out, *extra: str) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "jobs.cli",
        "bench",
        "throughput",
        "--engine",
        "vllm",
        "--model",
        model,
        "--json",
        str(out),
        "--threads",
        "1",
        "--old-users",
        "6",
        "--max-new-tokens",
        "8",
        *extra,
    ]


@pytest.mark.slow
def test_sigterm_to_the_vllm_bench_stops_its_level_processes(tmp_path_factory, tmp_path):
    import os
    import signal
    import subprocess
    import time

    model = _vllm_tiny(tmp_path_factory)
    bench = subprocess.Popen(
        _bench_command(
            model,
            tmp_path / "tp.json",
            "--methods",
            "vllm",
            "--concurrency",
            "2",
            "--min-prompts",
            "2",
            "--repeats",
            "3",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        levels: list[int] = []
        deadline = time.monotonic() + 600
        while not levels and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.5)
            levels = [p for p in _descendants(bench.pid) if "spawn_main" in _cmdline(p)]
        assert levels, (
            f"no level process appeared: {bench.poll()=}, {bench.stderr.read().decode()[-2000:] if bench.poll() is not None else ''}"
        )
        time.sleep(3)  # inside vLLM's start-up by now
        below = _descendants(bench.pid)
        assert all(_alive(p) for p in levels)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [(p, _cmdline(p)) for p in below if _alive(p)]
        assert not survivors, f"processes survived the bench's SIGTERM: {survivors}"
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
        for p in _descendants(bench.pid):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
def test_vllm_bench_on_a_tiny_model_reports_medians_spreads_and_drafting(tmp_path_factory, tmp_path):
    from benchmarks.throughput_vllm import VllmThroughputSettings, run_throughput_vllm

    model = _vllm_tiny(tmp_path_factory)
    s = VllmThroughputSettings(
        model=model,
        threads=1,
        concurrency=(2,),
        min_prompts=2,
        max_new_tokens=8,
        old_users=6,
        repeats=2,
        methods=("vllm", "laser-vllm greedy"),
    )
    out = tmp_path / "tp.json"
    report = run_throughput_vllm(out, s, cache_root=tmp_path / "fixtures")
    cell, ref = report["levels"]["2"]["laser-vllm greedy"], report["levels"]["2"]["vllm"]
    assert set(report["levels"]["2"]) == {"vllm", "laser-vllm greedy"}
    for m in (cell, ref):
        assert len(m["tokens_per_s_runs"]) == 2 and m["tokens_per_s_min"] <= m["tokens_per_s"] <= m["tokens_per_s_max"]
        assert m["identical_across_repeats"] and m["prompts"] == 2
    assert cell["identical_to_vllm"] == 2 and cell["proposer_ms_per_step"] > 0 and cell["mean_draft_len"] >= 0
    assert cell["vs_vllm"] in ("tie", "faster", "slower") and ref["prefill_s"] > 0
    reuse = report["engine_reuse"]["2"]
    assert cell["engines"] == (1 if "laser-vllm greedy" in reuse["one_engine_for_all_repeats"] else 2)
    saved = json.loads(out.read_text())
    assert saved["complete"] and saved["levels"]["2"]["vllm"]["tokens_per_s"] == ref["tokens_per_s"]
    md = out.with_suffix(".md").read_text()
    assert "ms/step" in md and "[" in md and out.with_suffix(".png").stat().st_size > 0
