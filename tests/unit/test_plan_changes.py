"""What a run regenerates (pipelines/knowledge/plan.py): new entities, changed inputs, another config;
--keep-existing; a resumed run; the first wave of groups with no earlier knowledge; the latest view's
order by the driver's run sequence, not by clocks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from pipelines.knowledge.plan import plan_changes, split_first_wave
from pipelines.ops.schedule.latest import newest_per_entity
from pipelines.workers import GenerationRequest

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rows(*rows: tuple[str, str, str, str, int, int]) -> pl.DataFrame:
    """(entity_id, source_hash, config_hash, run_id, run_seq, seconds after NOW) user rows."""
    return pl.DataFrame(
        [
            {
                "entity_type": "user",
                "entity_id": e,
                "knowledge": f"text of {e} by {r}",
                "source_hash": h,
                "config_hash": c,
                "run_id": r,
                "run_seq": q,
                "generated_at": NOW + timedelta(seconds=s),
            }
            for e, h, c, r, q, s in rows
        ]
    )


def _req(eid: str, source: str, pool: str | None = None) -> GenerationRequest:
    return GenerationRequest("user", eid, pool_key=pool, source_hash=source)


def test_config_change_regenerates_unless_kept():
    rows = _rows(("a", "ha", "c1", "r1", 0, 0), ("b", "hb", "c1", "r1", 0, 0))
    reqs = [_req("a", "ha"), _req("b", "hb2"), _req("c", "hc")]
    same = plan_changes(reqs, rows, "c1")
    assert (same.new, same.changed, same.unchanged, same.other_config) == (1, 1, 1, 0)
    other = plan_changes(reqs, rows, "c2")  # another decoder: a's row is stale too, and said so
    assert [r.entity_id for r in other.todo] == ["a", "b", "c"] and other.other_config == 1
    kept = plan_changes(reqs, rows, "c2", keep_existing=True)
    assert [r.entity_id for r in kept.todo] == ["b", "c"] and kept.other_config == 1 and kept.unchanged == 1
    assert other.earlier[("user", "a")] == "text of a by r1"


def test_resumed_run_skips_what_it_wrote_and_finished_runs_do_not_count_as_resumed():
    rows = _rows(("a", "ha", "c1", "r1", 0, 0), ("a", "ha2", "c1", "r2", 1, 5))
    reqs = [_req("a", "ha2"), _req("b", "hb")]
    resumed = plan_changes(reqs, rows, "c1", resuming="r2")  # r2 was killed after writing a
    assert [r.entity_id for r in resumed.todo] == ["b"] and resumed.resumed == 1 and resumed.changed == 1
    again = plan_changes(reqs, rows, "c1")  # r2 finished: a is simply unchanged
    assert [r.entity_id for r in again.todo] == ["b"] and again.unchanged == 1 and again.resumed == 0


def test_latest_view_follows_the_run_sequence_not_the_clock():
    # run 2's node clock is a day behind run 1's: the newer run still wins
    rows = _rows(("a", "h1", "c", "r1", 1, 86400), ("a", "h2", "c", "r2", 2, 0), ("b", "h", "c", "old", None, 99))
    view = newest_per_entity(rows.with_columns(pl.col("run_seq").cast(pl.Int64)))
    assert view.filter(pl.col("entity_id") == "a")["run_id"].item() == "r2"
    assert view.height == 2


def test_first_wave_takes_a_share_of_each_group_without_a_pool():
    todo = [_req(f"u{i}", "h", pool="user/attribute/x") for i in range(20)] + [_req("p", "h", pool="user/collab/0")]
    rest, first = split_first_wave(todo, {"user/collab/0"}, 0.1)
    assert len(first) == 2 and all(r.pool_key == "user/attribute/x" for r in first)
    assert len(rest) == 19 and {r.key for r in rest} | {r.key for r in first} == {r.key for r in todo}
    assert split_first_wave(todo, set(), 0.0) == (todo, [])
    assert split_first_wave(todo, {"user/collab/0"}, 0.1)[1] == first  # a resumed run picks the same ones
