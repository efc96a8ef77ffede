"""The whole knowledge job on ``execution.engine: vllm`` through local Ray, against the same job on hf:
the same greedy knowledge for every entity (real routing and pools, LASER drafting from them), every new
entity written once with the knowledge schema and the engine recorded, drafts accepted inside vLLM, and
a second run over the same output finds nothing left to do. Skipped without vLLM."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm")

from pipelines.knowledge import job as jobmod  # noqa: E402
from pipelines.store.knowledge import KNOWLEDGE_SCHEMA, read_knowledge  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402
from test_job_e2e import expected_new_entities, job_config  # noqa: E402

pytestmark = pytest.mark.slow


def test_job_on_vllm_writes_what_hf_writes_and_resumes(ray_session, tmp_path):
    model = str(save_tiny_model(tmp_path / "tiny", hidden_size=128))  # vLLM's CPU attention: heads >= 32 wide
    texts, summaries = {}, {}
    for engine in ("hf", "vllm"):
        cfg = job_config(
            model,
            tmp_path / engine,
            f"execution.engine={engine}",
            "execution.num_workers=1",
            "decoder.params.K=4",
            f"execution.address={ray_session}",
            # the compiled model, as users' large runs get it (execution.compile: auto leaves a
            # run this small eager); the tiny random model's near-tied logits then match hf's
            "execution.compile=true",
        )
        summaries[engine] = summary = jobmod.run_job(cfg)
        assert summary.new.failed == 0 and summary.old.failed == 0
        rows = read_knowledge(tmp_path / engine / "knowledge")
        keys = list(zip(rows["entity_type"], rows["entity_id"]))
        assert len(keys) == len(set(keys)) and set(keys) == expected_new_entities(cfg)
        assert set(rows["engine"]) == {engine} and set(rows["decoder"]) == {"laser"}
        texts[engine] = dict(zip(keys, rows["knowledge"]))
    assert texts["vllm"] == texts["hf"]  # greedy LASER is lossless on both engines
    vllm = summaries["vllm"].new
    assert vllm.accepted_tokens > 0 and vllm.aal > 1.0  # LASER drafted inside vLLM, and drafts were accepted
    shard = sorted((tmp_path / "vllm" / "knowledge").glob("part-*.parquet"))[0]
    assert pq.read_schema(shard).remove_metadata().equals(KNOWLEDGE_SCHEMA)
    again = jobmod.run_job(cfg)  # the same config over the same output: every entity is already written
    assert again.new.done == 0 and again.old.done == 0
    assert read_knowledge(tmp_path / "vllm" / "knowledge").height == len(texts["vllm"])
