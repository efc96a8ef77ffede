"""Ray Jobs submission (entrypoint and runtime env, no cluster) and the job CLI's config handling."""

from __future__ import annotations

import shlex
import sys
import types
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs import submit as submit_mod
from jobs.cli import app
from pipelines.store.location import StorageError
from pipelines.workers import BatchScheduler, GenerationRequest, make_batches


def test_entrypoint_quotes_overrides():
    cmd = submit_mod.entrypoint("job.yaml", ["output.path=runs/a b", "decoder.params.k=3"])
    assert cmd == "python -m jobs run job.yaml --set 'output.path=runs/a b' --set decoder.params.k=3"
    assert shlex.split(cmd) == [
        "python",
        "-m",
        "jobs",
        "run",
        "job.yaml",
        "--set",
        "output.path=runs/a b",
        "--set",
        "decoder.params.k=3",
    ]


def test_submit_builds_the_job_without_a_cluster(tmp_path, monkeypatch):
    config = tmp_path / "cfgs" / "ml.yaml"
    config.parent.mkdir()
    config.write_text(f"dataset:\n  format: synthetic\noutput:\n  path: {tmp_path / 'runs' / 'ml'}\n")
    calls = {}

    class FakeClient:
        def __init__(self, address, headers=None):
            calls["address"] = address

        def submit_job(self, **kwargs):
            calls.update(kwargs)
            calls["uploaded"] = submit_mod.uploaded_files(Path(kwargs["runtime_env"]["working_dir"]))
            with zipfile.ZipFile(kwargs["runtime_env"]["py_modules"][0]) as zf:  # the wheel exists while submitting
                calls["wheel"] = zf.namelist()
            return "raysubmit_123"

    fake = types.ModuleType("ray.job_submission")
    fake.JobSubmissionClient = FakeClient
    monkeypatch.setitem(sys.modules, "ray.job_submission", fake)
    job_id = submit_mod.submit(config, "http://head:8265", ["decoder.params.k=3"], pip=["extra==1.0"], env={"A": "1"})
    assert job_id == "raysubmit_123"
    assert calls["address"] == "http://head:8265"
    assert calls["entrypoint"] == "python -m jobs run ml.yaml --set decoder.params.k=3 --set execution.address=auto"
    env = calls["runtime_env"]
    assert calls["uploaded"] == ["ml.yaml"] and env["pip"] == ["extra==1.0"]
    assert env["env_vars"] == {"A": "1"}
    assert len(env["py_modules"]) == 1 and env["py_modules"][0].endswith("-py3-none-any.whl")  # the project's wheel
    assert {"laser/__init__.py", "jobs/__main__.py"} <= set(calls["wheel"])
    assert any(n.endswith(".dist-info/entry_points.txt") for n in calls["wheel"])
    calls.clear()
    submit_mod.submit(config, "http://head:8265", ["execution.address=ray://other:10001"])
    assert calls["entrypoint"].endswith("--set execution.address=ray://other:10001")  # an explicit address is kept
    with pytest.raises(ValueError, match=r"decoder\.nme: unknown key"):
        submit_mod.submit(config, "http://head:8265", ["decoder.nme=x"])  # validated before submission
    with pytest.raises(ValueError, match=r"decoder\.params\.zz: decoder 'laser' takes no parameter"):
        submit_mod.submit(config, "http://head:8265", ["decoder.params.zz=1"])
    with pytest.raises(submit_mod.SubmitError, match=r"output\.path: 'runs/x' is relative"):
        submit_mod.submit(config, "http://head:8265", ["output.path=runs/x"])
    with pytest.raises(submit_mod.SubmitError, match=r"output\.path: nosuchfs://b/x: no usable filesystem"):
        submit_mod.submit(config, "http://head:8265", ["output.path=nosuchfs://b/x"])
    with pytest.raises(submit_mod.SubmitError, match=r"is a URI, so the derived files .* need output\.work_dir"):
        submit_mod.submit(config, "http://head:8265", ["output.path=memory://b/x"])
    with pytest.raises(StorageError, match=r"memory:///?b/x: the latest view is a Delta Lake table"):
        submit_mod.submit(config, "http://head:8265", ["output.path=memory://b/x", f"output.work_dir={tmp_path / 'w'}"])
    calls.clear()
    pytest.importorskip("s3fs")
    submit_mod.submit(config, "http://head:8265", ["output.path=s3://b/x", f"output.work_dir={tmp_path / 'w'}"])
    assert "output.path=s3://b/x" in calls["entrypoint"]  # a URI output with a shared work dir is sent


def test_cli_names_the_bad_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("execution:\n  num_workerz: 2\n")
    result = CliRunner().invoke(app, ["run", str(config)])
    assert result.exit_code == 2
    assert "execution.num_workerz: unknown key" in result.output
    result = CliRunner().invoke(app, ["route", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "config file not found" in result.output


def test_batches_grouped_by_pool_and_scheduled_with_affinity():
    reqs = [
        GenerationRequest("user", f"u{i}", pool_key=k)
        for i, k in enumerate(["p/a", "p/b", "p/a", "p/a", "p/b", None, "p/a"])
    ]
    batches = make_batches(reqs, batch_size=2)
    assert {k: [[r.entity_id for r in b] for b in q] for k, q in batches.items()} == {
        "p/a": [["u0", "u2"], ["u3", "u6"]],
        "p/b": [["u1", "u4"]],
        None: [["u5"]],
    }
    sched = BatchScheduler(batches)
    first = [r.pool_key for r in sched.next_for(0)]
    second = [r.pool_key for r in sched.next_for(1)]
    assert first == ["p/a", "p/a"] and second == ["p/b", "p/b"]  # the two actors start on different pools
    assert [r.pool_key for r in sched.next_for(0)] == ["p/a", "p/a"]  # actor 0 keeps its pool
    assert [r.entity_id for r in sched.next_for(1)] == ["u5"]
    assert sched.next_for(0) is None and not sched


def _fake_ray_client(monkeypatch, calls):
    class FakeClient:
        def __init__(self, address, headers=None):
            pass

        def submit_job(self, **kwargs):
            wd = Path(kwargs["runtime_env"]["working_dir"])
            calls["everything"] = sorted(str(p.relative_to(wd)) for p in wd.rglob("*"))
            calls["uploaded"] = submit_mod.uploaded_files(wd)
            calls.update(kwargs)
            return "raysubmit_1"

    fake = types.ModuleType("ray.job_submission")
    fake.JobSubmissionClient = FakeClient
    monkeypatch.setitem(sys.modules, "ray.job_submission", fake)


def test_submit_uploads_the_config_alone_never_secrets_beside_it(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "cfgs"
    (folder / "sub").mkdir(parents=True)
    config = folder / "ml.yaml"
    config.write_text(f"output:\n  path: {tmp_path / 'runs'}\n")
    for name in (".env", "token", "ray-token.txt", "sub/notes.md", "id_rsa", "prod.env", "id_ed25519", "kubeconfig"):
        (folder / name).write_text("s3cr3t")
    for name in ("main.tfstate", "cert.pfx"):
        (folder / name).write_text("s3cr3t")
    (folder / "sub" / "deploy.yaml").write_text("key: |\n  -----BEGIN OPENSSH PRIVATE KEY-----\n  abc\n")
    (folder / "sub" / "aws.ini").write_text("[default]\naws_secret_access_key = abc\n")
    calls = {}
    _fake_ray_client(monkeypatch, calls)
    with caplog.at_level("INFO"):
        submit_mod.submit(config, "http://head:8265")
    assert calls["everything"] == ["ml.yaml"]  # only the config travels by default
    assert "uploading to http://head:8265" in caplog.text and "ml.yaml" in caplog.text
    submit_mod.submit(config, "http://head:8265", working_dir=folder)  # an explicit folder: secrets excluded
    assert calls["uploaded"] == ["ml.yaml", "sub/notes.md"]  # by name, and by content (a key, a credential)
    assert {".?*", "*token*", "/sub/aws.ini", "/sub/deploy.yaml"} <= set(calls["runtime_env"]["excludes"])
    assert "not uploading sub/deploy.yaml" in caplog.text
    assert calls["entrypoint"].startswith("python -m jobs run ml.yaml")
    with pytest.raises(submit_mod.SubmitError, match="not inside it"):
        submit_mod.submit(config, "http://head:8265", working_dir=tmp_path / "elsewhere")


def test_a_token_over_plain_http_is_warned_about(tmp_path, monkeypatch, caplog):
    calls = {}
    _fake_ray_client(monkeypatch, calls)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0k")
    with caplog.at_level("WARNING"):
        submit_mod.client("http://127.0.0.1:8265")
        assert "plain http" not in caplog.text  # this machine: no network crossed
        submit_mod.client("https://head:8265")
        assert "plain http" not in caplog.text
        submit_mod.client("http://head:8265")
    assert "sending the cluster's token over plain http" in caplog.text


def test_submit_os_errors_are_one_line(tmp_path):
    config = tmp_path / "ml.yaml"
    config.write_text(f"output:\n  path: {tmp_path / 'runs'}\n")
    missing = tmp_path / "no-such-token"
    res = CliRunner().invoke(app, ["submit", str(config), "--token-file", str(missing)])
    assert res.exit_code == 2 and str(missing) in res.output and "No such file" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["submit", str(config), "--address", "http://127.0.0.1:9"])
    assert res.exit_code == 1, res.output
    assert "http://127.0.0.1:9" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "status, driver_code, want", [("SUCCEEDED", 0, 0), ("FAILED", 3, 3), ("FAILED", 75, 75), ("STOPPED", None, 1)]
)
def test_submit_wait_exits_with_the_jobs_exit_code(tmp_path, monkeypatch, status, driver_code, want):
    from ray.job_submission import JobStatus

    config = tmp_path / "ml.yaml"
    config.write_text(f"output:\n  path: {tmp_path / 'runs'}\n")

    class FakeClient:
        async def tail_job_logs(self, job_id):
            yield "the job's log\n"

        def get_job_info(self, job_id):
            return types.SimpleNamespace(status=JobStatus[status], driver_exit_code=driver_code)

    monkeypatch.setattr(submit_mod, "submit", lambda *a, **k: "raysubmit_7")
    monkeypatch.setattr(submit_mod, "client", lambda *a, **k: FakeClient())
    res = CliRunner().invoke(app, ["submit", str(config), "--wait"])
    assert res.exit_code == want, res.output
    assert f"job raysubmit_7 finished with exit status {want}" in res.stderr


def test_submit_takes_the_cluster_from_ray_address(tmp_path, monkeypatch):
    config = tmp_path / "ml.yaml"
    config.write_text(f"output:\n  path: {tmp_path / 'runs'}\n")
    seen = {}
    monkeypatch.setattr(submit_mod, "submit", lambda config, address, *a, **k: seen.setdefault("address", address))
    monkeypatch.setenv("RAY_ADDRESS", "http://head.example:8265")
    res = CliRunner().invoke(app, ["submit", str(config)])
    assert res.exit_code == 0, res.output
    assert seen["address"] == "http://head.example:8265" and "--address http://head.example:8265" in res.output
    seen.clear()
    res = CliRunner().invoke(app, ["submit", str(config), "--address", "http://other:8265"])  # the option wins
    assert res.exit_code == 0 and seen["address"] == "http://other:8265"
