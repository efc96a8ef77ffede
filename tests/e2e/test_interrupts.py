"""SIGINT/SIGTERM on a real `laser run` subprocess: the rows already generated are flushed as a shard,
the command says what it kept and how to resume, and exits 128 + the signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipelines.store.knowledge import read_knowledge

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, model: str) -> Path:
    cfg = {
        "dataset": {
            "format": "synthetic",
            "seed": 3,
            "synthetic": {"n_users": 16, "n_items": 24, "n_clusters": 2, "max_history": 10},
        },
        "split": {"max_hist": 6},
        "model": {"name": model, "dtype": "float32"},
        "decoder": {"name": "autoregressive"},
        "generation": {"max_new_tokens": 64, "max_prompt_tokens": 2000},
        "old_knowledge": {"max_new_tokens": 4},
        "routing": {"n_clusters": 2, "max_group_size": 6, "lightgcn": {"max_epochs": 5}},
        "execution": {"num_workers": 1, "batch_size": 1},
        "output": {"path": str(tmp_path / "out"), "shard_rows": 1000},
    }  # nothing flushes before the end
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_flushes_finished_rows_and_says_how_to_resume(tiny_model, tmp_path, sig, code):
    config = write_config(tmp_path, tiny_model)
    # every progress update is printed (a pipe otherwise gets one every 30 s): the test waits on them
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TQDM_MININTERVAL": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "run", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.set_blocking(proc.stderr.fileno(), False)
    seen, deadline = b"", time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # wait for 3 finished new-knowledge entities
        seen += proc.stderr.read() or b""
        if re.search(rb"new knowledge:[^\r\n]*\|\s*([3-9]|\d\d+)/", seen):
            break
        time.sleep(0.05)
    assert proc.poll() is None, seen.decode(errors="replace")[-3000:]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    err = (seen + err).decode(errors="replace")
    assert proc.returncode == code, err[-3000:]
    kept = read_knowledge(tmp_path / "out" / "knowledge")
    assert kept.height >= 3  # the finished rows were flushed although shard_rows was never reached
    assert f"interrupted by {sig.name}" in err
    assert f"kept {kept.height} new knowledge rows" in err
    assert "resume with the same command" in err and str(config) in err
    assert "Traceback" not in err


def test_ray_wait_lets_an_interrupt_through_the_compiled_wait(monkeypatch):
    """A signal handled inside Ray's compiled wait surfaces as SystemError; ray_wait re-raises the interrupt."""
    import ray

    from pipelines.workers.interrupts import JobInterrupted, ray_wait

    def interrupted_wait(*args, **kwargs):
        try:
            raise JobInterrupted(signal.SIGTERM)
        except JobInterrupted as inner:
            raise SystemError("returned a result with an exception set") from inner

    monkeypatch.setattr(ray, "wait", interrupted_wait)
    with pytest.raises(JobInterrupted):
        ray_wait([])
    monkeypatch.setattr(ray, "wait", lambda *a, **k: (_ for _ in ()).throw(SystemError("other")))
    with pytest.raises(SystemError, match="other"):
        ray_wait([])
