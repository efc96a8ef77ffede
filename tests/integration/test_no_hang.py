"""A run never hangs and never hides a broken engine: a worker whose serve loop raises hands its requests
back at once, a worker that declares itself dead hands them to the others, and workers whose engine
cannot start or fails every request with one error stop the run with that error (EngineUnusable) after
the first batch. Fake workers (no model) go through the real WorkerGroup on local Ray; the vLLM cases
run the real engine (skipped without vLLM). Each test has a deadline: without the fix it hangs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from pipelines.store.knowledge import KnowledgeWriter, read_knowledge
from pipelines.workers import (
    EngineUnusable,
    Failure,
    GenerationRequest,
    ModelSpec,
    StreamWorker,
    WorkerDead,
    WorkerGroup,
)
from tests.helpers import save_tiny_model

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fake worker reaches the actors by value


class FakeWorker(StreamWorker):
    """No model: a request's row is :func:`_row`. The task says what goes wrong:
    ``raise`` (serve writes one row, then raises), ``die`` (dies after its first ``slots`` rows), ``die-one``
    (the first actor to start dies so, the others work), ``same`` (every request fails with one reason),
    ``each`` (every request fails with a reason of its own)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.taken = 0
        self.doomed = False
        try:  # ``spec.model`` is a folder: the first actor to claim it is the one that dies under ``die-one``
            os.close(os.open(Path(spec.model) / "doomed", os.O_CREAT | os.O_EXCL))
            self.doomed = True
        except FileExistsError:
            pass

    def serve(self, task: str, take, slots: int):
        from pipelines.workers import WorkResult

        written = 0
        while batch := take(slots):
            self.taken += len(batch)
            if task == "same":
                yield WorkResult(failures=[_fail(r, "RuntimeError: cannot run this model") for r in batch])
            elif task == "each":
                yield WorkResult(failures=[_fail(r, f"ValueError: {r.entity_id} has a bad title") for r in batch])
            elif task == "hang":  # takes its requests and never finishes one (a stuck engine)
                while True:
                    time.sleep(1)
            elif task == "raise":
                yield WorkResult(rows=[_row(batch[0])])
                raise RuntimeError("serve loop broke")
            else:
                if written >= slots and (task == "die" or (task == "die-one" and self.doomed)):
                    raise WorkerDead("the engine died again after 1 restart(s): EngineDeadError")
                time.sleep(0.05)
                yield WorkResult(rows=[_row(r) for r in batch])
                written += len(batch)


def _row(req: GenerationRequest) -> dict:
    from datetime import datetime, timezone

    return {
        "entity_type": req.entity_type,
        "entity_id": req.entity_id,
        "knowledge": "likes films",
        "model": "m",
        "decoder": "autoregressive",
        "decoder_params": "{}",
        "prompt_version": "v",
        "pool_kind": None,
        "group_id": None,
        "n_tokens": 2,
        "target_forwards": 2,
        "accepted_tokens": 0,
        "retrieval_s": 0.0,
        "generation_s": 0.1,
        "finish_reason": "eos",
        "run_id": "r",
        "generated_at": datetime(2024, 1, 1, tzinfo=timezone.utc),
    }


def _fail(req: GenerationRequest, reason: str) -> Failure:
    return Failure(req.entity_type, req.entity_id, reason)


def _users(n: int) -> list[GenerationRequest]:
    return [GenerationRequest("user", f"u{i}", history=[(f"Film {i}", 4.0)]) for i in range(n)]


def _group(tmp_path: Path, ray_session: str, workers: int = 2) -> WorkerGroup:
    return WorkerGroup(FakeWorker, ModelSpec(str(tmp_path)), num_workers=workers, address=ray_session)


def _drain(group: WorkerGroup, task: str, n: int, slots: int = 2):
    """(rows, failures) of streaming ``n`` users."""
    rows, failures = [], []
    for result in group.stream(_users(n), task, slots=slots, desc=task):
        rows += result.rows
        failures += result.failures
    return rows, failures


@pytest.mark.timeout(90)
def test_a_serve_loop_that_raises_fails_its_requests_with_the_error(tmp_path, ray_session):
    with _group(tmp_path, ray_session) as group:
        rows, failures = _drain(group, "raise", 12)
    keys = [r["entity_id"] for r in rows] + [f.entity_id for f in failures]
    assert sorted(keys) == sorted(f"u{i}" for i in range(12))  # every request ends once: none stranded
    assert rows and failures
    assert {f.reason for f in failures} == {"worker error: RuntimeError: serve loop broke"}


@pytest.mark.timeout(90)
def test_a_dead_worker_hands_its_requests_to_the_others(tmp_path, ray_session):
    with _group(tmp_path, ray_session) as group:
        rows, failures = _drain(group, "die-one", 24)
        assert len(group.broken) == 1 and "EngineDeadError" in next(iter(group.broken.values()))
    assert not failures
    assert sorted(r["entity_id"] for r in rows) == sorted(f"u{i}" for i in range(24))  # each once


@pytest.mark.timeout(90)
def test_when_every_worker_is_dead_the_run_stops_and_keeps_its_rows(tmp_path, ray_session):
    store, seen = tmp_path / "knowledge", []
    with _group(tmp_path, ray_session) as group, pytest.raises(EngineUnusable, match="every worker died") as err:
        with KnowledgeWriter(store, shard_rows=1) as writer:
            for result in group.stream(_users(40), "die", slots=2, desc="die"):
                for row in result.rows:
                    writer.add(row)
                    seen.append(row["entity_id"])
    assert "the engine died again after 1 restart(s)" in str(err.value)
    assert seen and sorted(read_knowledge(store)["entity_id"]) == sorted(seen)  # nothing written is lost


@pytest.mark.timeout(90)
def test_one_error_for_every_request_stops_the_run_after_the_first_batch(tmp_path, ray_session):
    yielded = []
    with _group(tmp_path, ray_session) as group:
        with pytest.raises(EngineUnusable, match="RuntimeError: cannot run this model"):
            for result in group.stream(_users(40), "same", slots=2, desc="same"):
                yielded.append(result)
        taken = sum(ray.get(a.__ray_call__.remote(lambda self: self.taken)) for a in group.actors)
    assert not [f for r in yielded for f in r.failures]  # no per-entity failure records
    assert taken < 40  # stopped after the first batch, not after trying every entity


@pytest.mark.timeout(90)
def test_a_worker_that_stops_making_progress_stops_the_run_within_the_deadline(tmp_path, ray_session):
    from pipelines.workers import Stalled

    group = WorkerGroup(FakeWorker, ModelSpec(str(tmp_path)), num_workers=1, address=ray_session, progress_timeout_s=3)
    with group, pytest.raises(Stalled, match=r"worker 0 finished none of its \d+ requests for 3 s") as err:
        t0 = time.monotonic()
        _drain(group, "hang", 6)
    assert time.monotonic() - t0 < 30 and "\n" not in str(err.value)


@pytest.mark.timeout(90)
def test_failures_of_their_own_are_per_entity(tmp_path, ray_session):
    with _group(tmp_path, ray_session) as group:
        rows, failures = _drain(group, "each", 12)
    assert not rows and len(failures) == 12  # bad inputs fail one by one; the run goes on


# ---- vLLM -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory) -> str:
    pytest.importorskip("vllm")
    return str(save_tiny_model(tmp_path_factory.mktemp("no-hang") / "tiny", hidden_size=128))


def _vllm_group(model: str, ray_session: str, workers: int = 1) -> WorkerGroup:
    from pipelines.knowledge.generation import GenerationWorker

    return WorkerGroup(
        GenerationWorker, ModelSpec(model, dtype="float32", compile=False, engine="vllm"), workers, ray_session
    )


def _task():
    from pipelines.knowledge.records import DecodeTask

    return DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000, run_id="r")


@pytest.mark.timeout(200)
def test_a_vllm_engine_that_cannot_start_stops_the_run(vllm_model, ray_session, tmp_path):
    broken = tmp_path / "unknown-architecture"
    shutil.copytree(vllm_model, broken)
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "architectures": ["NoSuchModelForCausalLM"]}))
    with _vllm_group(str(broken), ray_session) as group:
        with pytest.raises(EngineUnusable, match="no worker could start") as err:
            list(group.stream(_users(6), _task(), slots=2, desc="knowledge"))
    assert "NoSuchModelForCausalLM" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.timeout(200)
def test_a_vllm_engine_that_cannot_run_the_model_stops_the_run(ray_session, tmp_path):
    pytest.importorskip("vllm")
    model = save_tiny_model(tmp_path / "head-dim-16", hidden_size=64)  # 16-wide heads: vLLM's CPU attention refuses
    yielded = []
    with _vllm_group(str(model), ray_session) as group:
        with pytest.raises(EngineUnusable, match="Unsupported CPU attention configuration: head_dim=16"):
            for result in group.stream(_users(40), _task(), slots=2, desc="knowledge"):
                yielded.append(result)
    assert not [f for r in yielded for f in r.failures]


@pytest.mark.timeout(240)
def test_a_killed_vllm_engine_core_is_restarted_once_then_the_worker_is_dead(vllm_model):
    """vLLM's engine core in its own process: killed mid-pass, a new engine takes over what it held and
    every row is written; killed again, the worker is dead (the driver then hands its requests on)."""
    from collections import deque

    from pipelines.knowledge.generation import GenerationWorker

    def core_pid(w) -> int:
        return w.adapter.engine.llm.llm_engine.engine_core.resources.engine_manager.processes[0].pid

    worker = GenerationWorker(
        ModelSpec(vllm_model, dtype="float32", compile=False, engine="vllm", engine_options={"in_process": False})
    )
    worker.ready(2)
    waiting, rows, first = deque(_users(8)), [], core_pid(worker)
    try:
        for part in worker.serve(_task(), lambda n: [waiting.popleft() for _ in range(min(n, len(waiting)))], 2):
            assert not part.failures, part.failures
            rows += part.rows
            if len(rows) == 2 and worker.adapter.restarts == 0:
                os.kill(first, signal.SIGKILL)  # six requests still to decode, two of them in the engine
        assert sorted(r.entity_id for r in rows) == [f"u{i}" for i in range(8)]
        assert worker.adapter.restarts == 1 and core_pid(worker) != first
        os.kill(core_pid(worker), signal.SIGKILL)
        waiting.extend(_users(2))
        with pytest.raises(WorkerDead, match="died again"):
            list(worker.serve(_task(), lambda n: [waiting.popleft() for _ in range(min(n, len(waiting)))], 2))
    finally:
        if worker.adapter.engine is not None:
            worker.adapter.engine.close()
