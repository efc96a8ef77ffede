"""The failure ledger (failures.jsonl): an append after a torn last line loses nothing, and a reason that
repeats with other numbers or addresses in it is the same failure for give_up_after."""

from __future__ import annotations

import json

from pipelines.ops.schedule.failures import same_reason, streaks
from pipelines.store.shards import append_failures, read_failures


def _rec(reason: str, run: str) -> dict[str, object]:
    return {
        "entity_type": "user",
        "entity_id": "u1",
        "reason": reason,
        "run_id": run,
        "source_hash": "h",
        "config_hash": "c",
    }


def test_an_append_after_a_torn_line_keeps_the_new_record(tmp_path):
    whole = json.dumps(_rec("ValueError: x", "r0"))
    (tmp_path / "failures.jsonl").write_text(whole + "\n" + whole[: len(whole) // 2])  # a crash mid-append
    append_failures(tmp_path, [_rec("ValueError: x", "r1")])
    lines = read_failures(tmp_path, unresolved=False, every_line=True)
    assert lines["run_id"].to_list() == ["r0", "r1"]  # the torn line is skipped, the new one read
    append_failures(tmp_path, [_rec("ValueError: x", "r2")])  # and the file ends cleanly again
    assert read_failures(tmp_path, unresolved=False, every_line=True)["run_id"].to_list() == ["r0", "r1", "r2"]


def test_reasons_differing_only_in_numbers_and_addresses_make_one_streak(tmp_path):
    assert same_reason(
        "TimeoutError: no answer after 30.5 s at 0x7f3a12", "TimeoutError: no answer after 31.2 s at 0x7f99aa"
    )
    assert not same_reason("ValueError: prompt too long", "KeyError: 'title'")
    append_failures(tmp_path, [_rec(f"RuntimeError: step {n} took {n * 1.5} s", f"r{n}") for n in range(3)])
    s = streaks(read_failures(tmp_path, unresolved=False, every_line=True))[("user", "u1")]
    assert s.count == 3  # identical failures: give_up_after can act on them
