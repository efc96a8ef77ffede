"""A scheduled run whose engine cannot run the model (vLLM's CPU attention refuses 16-wide heads) ends after
the first batch with one line naming the engine's error and exit 1: the ledger row says failed, the
output's lock is released and no latest view is written. Skipped without vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm")

from pipelines.store.lock import output_lock  # noqa: E402
from pipelines.ops.schedule import exitcodes  # noqa: E402
from pipelines.ops.schedule.latest import LATEST_TABLE  # noqa: E402
from pipelines.ops.schedule.ledger import RunLedger  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402
from test_schedule_incremental import incremental_config, write_table_data  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LASER = [sys.executable, "-c", "from jobs.cli import app; app(prog_name='laser')"]
REFUSAL = "Unsupported CPU attention configuration: head_dim=16"


@pytest.mark.timeout(115)
def test_an_engine_that_cannot_run_the_model_ends_the_run_with_its_error(tmp_path):
    model = save_tiny_model(tmp_path / "head-dim-16", hidden_size=64)
    out = tmp_path / "job"
    cfg = incremental_config(
        str(model),
        write_table_data(tmp_path / "data"),
        out,
        "execution.engine=vllm",
        "execution.num_workers=1",
        "execution.compile=false",
    )
    config_file = tmp_path / "job.yaml"
    config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    run = subprocess.run(
        [*LASER, "run", str(config_file), "--incremental"], cwd=REPO, capture_output=True, text=True, timeout=110
    )
    assert run.returncode == exitcodes.ERROR, run.stderr[-3000:]
    lines = [ln for ln in run.stderr.splitlines() if REFUSAL in ln]
    assert len(lines) == 1 and lines[0].startswith("laser: "), run.stderr[-3000:]  # one line, not one per entity
    assert "Traceback" not in run.stderr
    [record] = RunLedger(out).records()
    assert record.status == "failed" and REFUSAL in record.error
    assert not (out / LATEST_TABLE).exists()  # no empty latest view
    with output_lock(out):  # released: the next run can take it
        pass
