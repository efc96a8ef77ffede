"""Small things of the command line: fast --help, real flags, --version, quiet local Ray, no unused pools."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from jobs.cli import app


def test_help_imports_no_heavy_module():
    code = "import sys, jobs.cli; print(sorted(m for m in ('torch', 'sklearn', 'ray', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_boolean_options_are_flags():
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "<bool>" not in top.output
    assert "-v, --verbose" in top.output and "--version" in top.output
    gen = runner.invoke(app, ["generate", "--help"])
    assert "--old " in gen.output and "<bool>" not in gen.output


def test_version_comes_from_the_distribution():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"laser {version('laser-knowledge')}"


def test_ctr_eval_default_encoder_is_the_encoding_module_s():
    from pipelines.ctr.config import DEFAULT_ENCODER
    from pipelines.ops.features.encoding import DEFAULT_ENCODER as ENCODING_DEFAULT

    assert DEFAULT_ENCODER == ENCODING_DEFAULT


@pytest.mark.parametrize("policy, built", [("attribute", False), ("warm_cold", True)])
def test_item_collaborative_groups_only_when_the_policy_uses_them(policy, built):
    from jobs.config import load_config
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.routing import groups_of

    cfg = load_config(
        None,
        [
            "dataset.synthetic.n_users=12",
            "dataset.synthetic.n_items=16",
            "split.max_hist=4",
            f"routing.item_policy={policy}",
            "routing.n_clusters=2",
            "routing.lightgcn={max_epochs: 2}",
        ],
    )
    groups = groups_of(cfg, load_job_data(cfg))
    assert (groups["item"][1] is not None) == built
    assert groups["user"][1] is not None  # users: warm_cold uses them


@pytest.mark.slow
def test_local_ray_prints_no_token_notice(tmp_path):
    code = (
        "from pipelines.workers import ensure_ray; import ray; ensure_ray(None, 1); "
        "print(ray.cluster_resources()['CPU']); ray.shutdown()"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_AUTH_MODE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("1.0")
    assert "Token authentication" not in out.stderr + out.stdout
