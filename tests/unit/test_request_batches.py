"""The driver holds the prompt inputs of one batch of planned requests at a time: filled before the batch is
sent, emptied after, batches in pool order."""

from __future__ import annotations

import pipelines.knowledge.job as job_mod
from jobs.config import load_config
from pipelines.workers import Failure, GenerationRequest
from pipelines.knowledge.generation import BatchResult


class RecordingGroup:
    """Fails every request it gets (no model), remembering what each batch looked like when it was sent."""

    startup_s = 0.0  # started before: nothing to wait for

    def __init__(self, requests: list[GenerationRequest]) -> None:
        self.all, self.sent = requests, []

    def working(self) -> int:
        return 1

    def stream(self, batch, task, *, slots, desc, unit="entity"):
        filled = {r.key for r in self.all if r.history is not None}
        self.sent.append(([r.key for r in batch], filled, desc))
        yield BatchResult(failures=[Failure(r.entity_type, r.entity_id, "test") for r in batch])


def test_payloads_are_attached_a_batch_at_a_time_in_pool_order(tmp_path, monkeypatch):
    monkeypatch.setattr(job_mod, "REQUEST_BATCH", 3)
    cfg = load_config(None, [f"output.path={tmp_path}"])
    requests = [
        GenerationRequest("user", f"u{k}", pool_key=f"user/attribute/{k % 2}", source_hash="h") for k in range(7)
    ]
    group = RecordingGroup(requests)
    filled_batches: list[int] = []

    def payloads(batch: list[GenerationRequest]) -> None:
        filled_batches.append(len(batch))
        for r in batch:
            r.history = [("T", 4.0)]

    task = job_mod.DecodeTask(decoder="autoregressive", run_id="r")
    report = job_mod.write_knowledge(cfg, requests, task, tmp_path / "knowledge", "new", group, payloads=payloads)
    assert filled_batches == [3, 3, 1] and report.failed == 7
    for keys, filled, desc in group.sent:
        assert filled == set(keys)  # this batch's inputs alone are held while it is decoded
    assert [k for keys, _, _ in group.sent for k in keys] == sorted(
        (r.key for r in requests), key=lambda k: (f"user/attribute/{int(k[1][1:]) % 2}", k)
    )  # pool order
    assert [d for _, _, d in group.sent] == ["new (1/3)", "new (2/3)", "new (3/3)"]
    assert all(r.history is None for r in requests)  # emptied after
