"""The whole knowledge job on ``execution.engine: vllm`` through local Ray: one vLLM engine per worker
actor, every new entity written once with the knowledge schema, and a second run over the same output
finds nothing left to do. Skipped without vLLM."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

pytest.importorskip("vllm")

from pipelines.knowledge import job as jobmod  # noqa: E402
from pipelines.knowledge_store import KNOWLEDGE_SCHEMA, read_knowledge  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402
from test_job_e2e import expected_new_entities, job_config  # noqa: E402

pytestmark = pytest.mark.slow


def test_job_on_vllm_writes_every_entity_once_and_resumes(ray_session, tmp_path):
    model = str(save_tiny_model(tmp_path / "tiny", hidden_size=128))  # vLLM's CPU attention: heads >= 32 wide
    cfg = job_config(model, tmp_path / "out", "execution.engine=vllm", "execution.num_workers=1",
                     f"execution.address={ray_session}")
    summary = jobmod.run_job(cfg)
    assert summary.new.failed == 0 and summary.old.failed == 0
    rows = read_knowledge(tmp_path / "out" / "knowledge")
    keys = list(zip(rows["entity_type"], rows["entity_id"]))
    assert len(keys) == len(set(keys)) and set(keys) == expected_new_entities(cfg)
    shard = sorted((tmp_path / "out" / "knowledge").glob("part-*.parquet"))[0]
    assert pq.read_schema(shard).remove_metadata().equals(KNOWLEDGE_SCHEMA)
    assert set(rows["decoder"]) == {"laser"} and (rows["target_forwards"] >= 1).all()
    again = jobmod.run_job(cfg)  # the same config over the same output: every entity is already written
    assert again.new.done == 0 and again.old.done == 0
    assert read_knowledge(tmp_path / "out" / "knowledge").height == rows.height
