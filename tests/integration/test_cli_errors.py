"""Bad input on the command line: one message, exit code 2, no traceback, nothing created."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobs.cli import app

CASES = {
    "unknown decoder": (["--set", "decoder.name=nope"], "decoder.name: unknown decoder 'nope'"),
    "unknown parameter": (["--set", "decoder.params.kk=3"], "decoder.params.kk: decoder 'laser' takes no parameter"),
    "bad parameter value": (["--set", "decoder.params.verification=bogus"],
                            "decoder.params: verification must be 'relaxed' or 'greedy'"),
    "missing dataset": (["--set", "dataset.format=movielens", "--set", "dataset.path=/nonexistent/ml"],
                        "dataset.path '/nonexistent/ml' (format movielens) does not exist"),
    "bad parameter type": (["--set", "decoder.params.k=0"], "decoder.params: verification k must be an integer >= 1"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_creates_nothing(case, tmp_path):
    args, message = CASES[case]
    out = tmp_path / "job"
    result = CliRunner().invoke(app, ["run", "jobs/configs/demo.yaml", "--set", f"output.path={out}", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_route_without_dataset_is_clean(tmp_path):
    result = CliRunner().invoke(app, ["route", "jobs/configs/movielens.yaml", "--set", "dataset.path=/nope",
                                      "--set", f"output.path={tmp_path / 'x'}"])
    assert result.exit_code == 2 and "does not exist" in result.output
