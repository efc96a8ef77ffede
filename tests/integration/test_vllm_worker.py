"""``execution.engine: vllm``: the knowledge worker actor on vLLM writes the same rows as on hf (fields,
greedy text of the vLLM target), drafting from each request's routed pool. Skipped without vLLM."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from pipelines.knowledge.generation import DecodeTask  # noqa: E402
from pipelines.knowledge.vllm_worker import VllmGenerationWorker  # noqa: E402
from pipelines.workers import GenerationRequest, ModelSpec  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("vllm-worker") / "tiny", hidden_size=128)
    w = VllmGenerationWorker(ModelSpec(str(path), dtype="float32"))
    yield w
    if w.vllm is not None:
        w.vllm.close()


def _users(n: int, pool: bool = True) -> list[GenerationRequest]:
    return [GenerationRequest("user", f"u{i}", pool_key="user/collab/0" if pool else None, pool_kind="collab",
                              group_id="0", history=[(f"Film {i}", 4.0), ("Heat", 3.0)]) for i in range(n)]


def test_rows_keep_their_fields_and_greedy_text(worker, tmp_path, monkeypatch):
    plain = DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000)
    rows = {r["entity_id"]: r for r in worker.generate(plain, _users(5, pool=False), slots=4).rows}
    assert len(rows) == 5
    from pools.retrieval import RetrievalPool

    pool = RetrievalPool.from_token_ids([worker.lm.tokenizer(r["knowledge"], add_special_tokens=False)["input_ids"]
                                         for r in rows.values()])
    monkeypatch.setattr(worker, "_pool", lambda task, key: pool if key else None)
    lossless = DecodeTask("laser", {"verification": "greedy", "K": 4}, max_new_tokens=24, max_prompt_tokens=2000)
    out = worker.generate(lossless, _users(5), slots=4)
    assert not out.failures
    for r in out.rows:
        assert r["knowledge"] == rows[r["entity_id"]]["knowledge"]
        assert r["decoder"] == "laser" and r["group_id"] == "0" and r["finish_reason"] in ("eos", "length")
        for field in ("n_tokens", "target_forwards", "accepted_tokens", "generation_s", "decode_s", "degenerate"):
            assert field in r
    assert sum(r["accepted_tokens"] for r in out.rows) > 0
    assert sum(r["target_forwards"] for r in out.rows) < sum(r["target_forwards"] for r in rows.values())
