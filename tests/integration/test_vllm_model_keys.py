"""The model keys on a real vLLM engine: ``model.max_model_len`` null gives the model's own context length
(not the 2048 the job's engine once had whatever the model allowed), and ``model.engine_args`` reach vLLM's
engine as they are. One engine start; skipped without vLLM."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from pipelines.knowledge.generation import GenerationWorker  # noqa: E402
from pipelines.knowledge.records import DecodeTask  # noqa: E402
from pipelines.workers import GenerationRequest, ModelSpec  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402


def test_model_len_is_the_models_own_and_engine_args_pass_through(tmp_path):
    model = str(save_tiny_model(tmp_path / "tiny", hidden_size=128))  # max_position_embeddings 4096
    spec = ModelSpec(model, dtype="float32", engine="vllm", compile=False, engine_args={"max_logprobs": 3})
    worker = GenerationWorker(spec)
    try:
        worker.ready(2)
        engine = worker.adapter.engine
        assert engine is not None and engine.llm is not None
        config = engine.llm.llm_engine.model_config
        assert config.max_model_len == 4096  # the model's own: it fits the KV cache the job gives on CPU
        assert config.max_logprobs == 3  # model.engine_args, as given
        request = GenerationRequest("user", "u1", history=[("Heat", 4.0)])
        out = worker.generate(DecodeTask("autoregressive", max_new_tokens=8, max_prompt_tokens=2000), [request])
        assert not out.failures and len(out.rows) == 1
    finally:
        if worker.adapter.engine is not None:
            worker.adapter.engine.close()
