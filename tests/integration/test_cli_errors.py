"""Bad input on the command line: one message, exit code 2, no traceback, nothing created."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobs.cli import app

CASES = {
    "unknown decoder": (["--set", "decoder.name=nope"], "decoder.name: unknown decoder 'nope'"),
    "unknown parameter": (["--set", "decoder.params.kk=3"], "decoder.params.kk: decoder 'laser' takes no parameter"),
    "bad parameter value": (
        ["--set", "decoder.params.verification=bogus"],
        "decoder.params: verification must be 'relaxed' or 'greedy'",
    ),
    "missing dataset": (
        ["--set", "dataset.format=movielens", "--set", "dataset.path=/nonexistent/ml"],
        "dataset.path '/nonexistent/ml' (format movielens) does not exist",
    ),
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
    result = CliRunner().invoke(
        app,
        [
            "route",
            "jobs/configs/movielens.yaml",
            "--set",
            "dataset.path=/nope",
            "--set",
            f"output.path={tmp_path / 'x'}",
        ],
    )
    assert result.exit_code == 2 and "does not exist" in result.output


# ---- OS errors a user can cause: one line naming the path, 2 for a wrong path, 1 for the environment ----

import errno  # noqa: E402
import os  # noqa: E402


def _one_line(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output


SMALL = ["--set", "dataset.synthetic.n_users=20", "--set", "dataset.synthetic.n_items=20"]


def test_output_path_that_is_a_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file")
    result = CliRunner().invoke(app, ["run", "jobs/configs/demo.yaml", "--set", f"output.path={out}", *SMALL])
    _one_line(result, 2, str(out))


def test_read_only_output_folder(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, *args, **kwargs):  # as a read-only folder answers (the tests may run as root)
        if str(path).endswith(".run.lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", "jobs/configs/demo.yaml", "--set", f"output.path={out}", *SMALL])
    _one_line(result, 1, str(out / ".run.lock"), "Permission denied")


def test_disk_full_names_the_file(tmp_path, monkeypatch):
    """A full disk under the latest view's Delta write (delta-rs's I/O error names no file) names the table."""
    import deltalake

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(deltalake, "write_deltalake", full)
    result = CliRunner().invoke(app, ["latest", "jobs/configs/demo.yaml", "--set", f"output.path={out}"])
    _one_line(result, 1, str(out / "latest"), "No space left on device")


def test_dataset_folder_without_interactions_file(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "run",
            "jobs/configs/demo.yaml",
            "--set",
            f"output.path={tmp_path / 'o'}",
            "--set",
            "dataset.format=table",
            "--set",
            f"dataset.path={tmp_path}",
        ],
    )
    _one_line(result, 2, "is a directory: set dataset.interactions_file")


def test_config_not_utf8(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_bytes("dataset:\n  name: caf\xe9\n".encode("latin-1"))
    _one_line(CliRunner().invoke(app, ["run", str(config)]), 2, "not UTF-8")


def test_bench_throughput_names_the_hf_rows_it_knows(tmp_path):
    result = CliRunner().invoke(
        app, ["bench", "throughput", "--methods", "laser relaxed (auto),nope", "--json", str(tmp_path / "t.json")]
    )
    assert result.exit_code == 2 and "unknown method(s) ['nope']" in result.output
    assert "laser relaxed (auto)" in result.output and not (tmp_path / "t.json").exists()
