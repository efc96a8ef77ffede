"""``execution.engine: vllm``: requests join vLLM as they arrive; a worker actor killed mid-run loses no
row; the actor holds no transformers copy of the model. (What both engines must do alike is in
test_worker_engines.py; rows against an hf run of the whole job in tests/e2e/test_vllm_job.py.)
Skipped without vLLM."""

from __future__ import annotations

from collections import deque

import pytest

pytest.importorskip("vllm")

from pipelines.knowledge.records import DecodeTask  # noqa: E402
from pipelines.knowledge.generation import GenerationWorker  # noqa: E402
from pipelines.workers import GenerationRequest, ModelSpec  # noqa: E402
from tests.helpers import check_killed_actor_loses_no_row, save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("vllm-worker") / "tiny", hidden_size=128))


@pytest.fixture(scope="module")
def worker(vllm_model):
    w = GenerationWorker(ModelSpec(vllm_model, dtype="float32", engine="vllm"))
    yield w
    if w.adapter.engine is not None:
        w.adapter.engine.close()


def test_the_actor_holds_one_copy_of_the_model(worker):
    assert not hasattr(worker.adapter, "lm") and worker.tokenizer is not None  # vLLM holds the weights


def _users(n: int, pool: bool = True) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            "user",
            f"u{i}",
            pool_key="user/collab/0" if pool else None,
            pool_kind="collab",
            group_id="0",
            history=[(f"Film {i}", 4.0), ("Heat", 3.0)],
        )
        for i in range(n)
    ]


def test_requests_join_while_others_are_in_flight(worker):
    """The worker tops vLLM up as requests arrive: a request handed over while another is decoding joins
    it (a batch-at-a-time worker would finish the first before asking for the second)."""
    task = DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000)
    waiting, events = deque(_users(3, pool=False)), []

    def take(n: int) -> list[GenerationRequest]:  # a driver that has one request at a time to give
        got = [waiting.popleft()] if waiting and n else []
        events.extend(f"take {r.entity_id}" for r in got)
        return got

    busy = decode = tokens = 0
    for part in worker.serve(task, take, slots=3):
        events.extend(f"row {r.entity_id}" for r in part.rows)
        busy, decode, tokens = busy + part.busy_s, decode + part.decode_s, tokens + part.decode_tokens
    assert events[:3] == ["take u0", "take u1", "take u2"], events
    assert sorted(events[3:]) == ["row u0", "row u1", "row u2"]
    # the engine's clock: the steps with no prompt in them are timed apart, with the tokens they gave
    assert 0 < decode < busy and 0 < tokens <= 3 * 24


@pytest.mark.slow
def test_a_first_texts_genre_ban_goes_through_vllm(worker):
    """A first text's ban names every form of each genre its entity lacks (its room in vLLM:
    tests/unit/test_vllm_forms.py): vLLM takes it and the row is written."""
    from pipelines.knowledge.retry import first_rules

    task = DecodeTask("autoregressive", max_new_tokens=6, max_prompt_tokens=2000, ban_unsupported_genres=True)
    req = GenerationRequest("user", "u0", history=[("Heat", 4.0, ("Action", "Crime"))])
    assert len(first_rules(task, req, worker.genre_ban)["bad_words_ids"]) > 100
    result = worker.generate(task, [req])
    assert not result.failures and [r.entity_id for r in result.rows] == ["u0"]


def test_killed_vllm_worker_actor_loses_no_row(vllm_model, ray_session, tmp_path):
    """A Ray worker actor running vLLM is killed mid-run: Ray restarts it (a new engine), the driver
    re-sends what it held, and every entity is written once."""
    check_killed_actor_loses_no_row("vllm", vllm_model, 1, _users(24, pool=False), tmp_path / "knowledge")
