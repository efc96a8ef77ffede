"""`laser run CONFIG --dry-run`: the plan and its estimate, nothing written (pipelines/knowledge/dry_run.py)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from jobs.cli import app
from pipelines.knowledge.dry_run import dry_run
from pipelines.knowledge.paths import JobPaths
from tests.e2e.test_schedule_incremental import incremental_config, write_table_data


def test_dry_run_plans_every_entity_and_writes_nothing(tiny_model, tmp_path):
    data = write_table_data(tmp_path / "data", n_users=6)
    out = tmp_path / "job"
    cfg = incremental_config(tiny_model, data, out)
    est = dry_run(cfg)
    assert not out.exists() and not JobPaths.of(cfg).routing.exists()  # nothing written: no routing, no LightGCN
    assert est.planned == sum(r["entities"] for r in est.entities) > 6  # a first run: every entity is new
    assert {r["reason"] for r in est.entities} == {"new"}
    assert {r["entity_type"] for r in est.entities} == {"user", "item"}
    assert est.prompt_tokens > est.planned  # every prompt counted in the model's tokens
    assert est.new_tokens == est.planned * cfg.generation.max_new_tokens  # no earlier rows: the upper bound
    assert est.seconds > 0 and "step-cost table" in est.basis
    result = CliRunner().invoke(app, ["run", str(_write(cfg, tmp_path)), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)  # one JSON object, nothing else on stdout
    assert plan["planned"] == est.planned and plan["entities"] == est.entities and not out.exists()
    result = CliRunner().invoke(app, ["run", str(_write(cfg, tmp_path)), "--json"])
    assert result.exit_code == 2 and "--json goes with --dry-run" in result.output


def test_dry_run_after_a_run_counts_unchanged_and_uses_its_rate(tiny_model, ray_session, tmp_path):
    from pipelines.knowledge.job import run_job

    data = write_table_data(tmp_path / "data", n_users=4)
    out = tmp_path / "job"
    cfg = incremental_config(tiny_model, data, out, "generation.degenerate=keep")
    done = run_job(cfg, incremental=True).record.generated
    est = dry_run(cfg)
    assert est.planned == 0 and {r["reason"] for r in est.entities} == {"unchanged"}
    assert sum(r["entities"] for r in est.entities) == done
    assert "last run" in est.basis
    other = dry_run(incremental_config(tiny_model, data, out, "generation.max_new_tokens=6"))
    assert other.planned == done and {r["reason"] for r in other.entities} == {"config"}
    result = CliRunner().invoke(app, ["run", str(_write(cfg, tmp_path)), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "nothing written" in result.output and "to generate: 0 entities" in result.output


def _write(cfg, tmp_path):
    path = tmp_path / "job.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    return path
