"""A run's figures pushed to a Prometheus Pushgateway, the convention for batch jobs (a job is gone before a
scraper would come): set ``metrics.pushgateway`` (or ``LASER_PUSHGATEWAY``) to its address.

Each run replaces its group (job ``metrics.job``, grouping key ``output``: the job's output path), so a
dashboard reads the last run of every output. Gauges (``laser_`` prefix):

- ``run_status{status}``: 1 for the run's status (``succeeded``, ``partial``, ``failed``);
  ``run_last_success_timestamp_seconds`` when it finished (``succeeded`` or ``partial``): alert on its age;
- ``run_info{run_id, decoder, mode}``: 1;
- ``run_entities{pass, state}``: entities ``done``, ``failed``, ``given_up`` by pass (``new``, ``old``);
- ``run_tokens{pass, kind}``: ``written`` (tokens of the rows written), ``decoded`` (every attempt's),
  ``prompt`` and ``prompt_cached`` tokens;
- ``run_aal{pass}``: tokens per decoding forward; ``run_decode_tokens_per_second{pass}``;
- ``run_seconds{phase}``: the run's time account (load, route, plan, pools, startup, prefill, first decode,
  retries, writing, ...), and ``run_wall_seconds``.

A push that fails (gateway down, refused) is logged and never fails the run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

GATEWAY_ENV = "LASER_PUSHGATEWAY"
PREFIX = "laser_"
TIMEOUT_S = 10.0


def gateway(configured: str | None) -> str | None:
    """The Pushgateway to push to: the config's, else ``LASER_PUSHGATEWAY``, else None (no push)."""
    return configured or os.environ.get(GATEWAY_ENV) or None


def run_metrics(summary: Mapping[str, Any]) -> Any:
    """A Prometheus registry holding a run's gauges, from its ``summary.json`` form (``JobSummary.to_json``)."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(PREFIX + name, doc, labels, registry=reg)

    record = summary.get("record") or {}
    status = str(record.get("status") or "failed")
    gauge("run_status", "1 for the run's status", ("status",)).labels(status).set(1)
    if status in ("succeeded", "partial"):
        gauge("run_last_success_timestamp_seconds", "when the run finished").set(time.time())
    info = gauge("run_info", "the run", ("run_id", "decoder", "mode"))
    info.labels(str(summary.get("run_id", "")), str(record.get("decoder", "")), str(summary.get("mode", ""))).set(1)
    entities = gauge("run_entities", "entities by pass and state", ("pass", "state"))
    tokens = gauge("run_tokens", "tokens by pass and kind", ("pass", "kind"))
    aal = gauge("run_aal", "tokens per decoding forward", ("pass",))
    rate = gauge("run_decode_tokens_per_second", "decode throughput (steps without prefill)", ("pass",))
    for name in ("new", "old"):
        rep = summary.get(name) or {}
        entities.labels(name, "done").set(rep.get("done", 0))
        entities.labels(name, "failed").set(rep.get("failed", 0))
        for kind, key in (
            ("written", "n_tokens"),
            ("decoded", "decoded_tokens"),
            ("prompt", "prompt_tokens"),
            ("prompt_cached", "cached_prompt_tokens"),
        ):
            tokens.labels(name, kind).set(rep.get(key, 0))
        aal.labels(name).set(rep.get("aal", 0.0))
        rate.labels(name).set(rep.get("tokens_per_s_decode", 0.0))
    entities.labels("new", "given_up").set(record.get("given_up", 0))
    account = summary.get("time") or {}
    seconds = gauge("run_seconds", "the run's time account", ("phase",))
    for phase, value in (account.get("seconds") or {}).items():
        seconds.labels(phase).set(value)
    gauge("run_wall_seconds", "the run's wall time").set(account.get("wall_s", summary.get("wall_s", 0.0)))
    return reg


def push_run(summary: Mapping[str, Any], address: str | None, job: str, output: str) -> bool:
    """Push a run's gauges to the Pushgateway at ``address`` (replacing the output's group); False, logged,
    when it cannot be reached or refuses."""
    if not address:
        return False
    from prometheus_client import push_to_gateway

    try:
        push_to_gateway(
            address, job=job, grouping_key={"output": output}, registry=run_metrics(summary), timeout=TIMEOUT_S
        )
    except Exception as exc:  # noqa: BLE001 - metrics never fail a run
        log.warning("metrics: could not push to the Pushgateway at %s (%s); the run is not affected", address, exc)
        return False
    log.info("metrics: pushed the run's figures to %s (job %s, output %s)", address, job, output)
    return True
