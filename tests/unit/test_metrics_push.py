"""A run's figures reach a Prometheus Pushgateway (pipelines/ops/pushgateway.py), and a gateway that is down never
fails the run."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pipelines.knowledge.generation import GenerationReport
from pipelines.knowledge.summary import JobSummary
from pipelines.knowledge.time_account import TimeAccount
from pipelines.ops.pushgateway import GATEWAY_ENV, gateway, push_run
from pipelines.ops.schedule.ledger import RunRecord


class _Gateway(BaseHTTPRequestHandler):
    pushes: list[tuple[str, str, str]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        _Gateway.pushes.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pushgateway():
    _Gateway.pushes = []
    server = HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _summary() -> JobSummary:
    new = GenerationReport(
        done=5, failed=1, n_tokens=300, decoded_tokens=420, decoded_forwards=200, decoded_accepted=180
    )
    record = RunRecord("r7", "laser", "abc", status="partial", given_up=2)
    time = TimeAccount(seconds={"load": 1.5, "startup": 12.0, "prefill": 8.0}, wall_s=40.0)
    return JobSummary("runs/x/knowledge", "r7", GenerationReport(), new, 5, 1, 40.0, record=record, time=time)


def test_a_run_s_figures_are_pushed_under_its_output(pushgateway):
    assert push_run(_summary().to_json(), pushgateway, "laser_knowledge", "s3://team/knowledge-job")
    [(method, path, body)] = _Gateway.pushes
    assert method == "PUT" and path.startswith(
        "/metrics/job/laser_knowledge/output@base64/"
    )  # the run replaces its group
    lines = set(body.splitlines())
    for want in (
        'laser_run_status{status="partial"} 1.0',
        'laser_run_entities{pass="new",state="done"} 5.0',
        'laser_run_entities{pass="new",state="failed"} 1.0',
        'laser_run_entities{pass="new",state="given_up"} 2.0',
        'laser_run_tokens{kind="decoded",pass="new"} 420.0',
        'laser_run_aal{pass="new"} 1.9',
        'laser_run_seconds{phase="startup"} 12.0',
        "laser_run_wall_seconds 40.0",
        'laser_run_info{decoder="laser",mode="full",run_id="r7"} 1.0',
    ):
        assert want in lines, (want, body)
    assert any(line.startswith("laser_run_last_success_timestamp_seconds ") for line in lines)


def test_a_gateway_that_is_down_is_logged_and_the_run_goes_on(caplog):
    assert not push_run(_summary().to_json(), "127.0.0.1:9", "laser_knowledge", "runs/x")
    assert "could not push to the Pushgateway" in caplog.text


def test_the_gateway_comes_from_the_config_else_the_environment(monkeypatch):
    monkeypatch.delenv(GATEWAY_ENV, raising=False)
    assert gateway(None) is None and not push_run({}, None, "j", "o")
    monkeypatch.setenv(GATEWAY_ENV, "gw:9091")
    assert gateway(None) == "gw:9091" and gateway("mine:9091") == "mine:9091"
