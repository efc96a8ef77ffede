"""Fixtures of every tier (tests/unit, tests/integration, tests/e2e); shared helpers are in tests/helpers.py.

Every test session writes its caches (cost models, drafts, heads, work folders) to a temporary folder:
``LASER_CACHE_DIR`` points there, with the de-quantised bundled models linked in from the user's cache
so they are not rebuilt. Decoders built with ``K: auto`` get a fixed, pre-measured cost model unless a
test measures one itself (``laser.cost.forward_cost`` is untouched). Ray runs once per session. Jobs
whose ``execution.engine`` is ``auto`` run on hf (``LASER_ENGINE=hf``): vLLM's start-up stays out of
every test but the vLLM ones, which ask for it by name.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import laser
from tests.helpers import save_tiny_model

TIERS = ("unit", "integration", "e2e")  # the order they run in
# Where the shared test models run: cpu (CI) or cuda (scripts/device_check.sh runs the core tests on a GPU)
DEVICE = os.environ.get("LASER_TEST_DEVICE", "cpu")


@pytest.fixture
def device() -> torch.device:
    """Where device-side tensor code under test runs (``LASER_TEST_DEVICE``: cpu here, cuda on a GPU)."""
    return torch.device(DEVICE)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session", autouse=True)
def _hf_engine():
    """``execution.engine: auto`` resolves to hf in this session and the job processes it starts."""
    old = os.environ.get("LASER_ENGINE")
    os.environ["LASER_ENGINE"] = "hf"
    yield
    if old is None:
        os.environ.pop("LASER_ENGINE", None)
    else:
        os.environ["LASER_ENGINE"] = old


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    """Every cache in a temporary folder; the user's de-quantised bundled models linked in."""
    from laser.models import BUNDLED, cached_model_dir

    tmp = tmp_path_factory.mktemp("laser-cache")
    (tmp / "models").mkdir()
    for name in BUNDLED:
        if cached_model_dir(name).is_dir():  # still the user's cache here
            (tmp / "models" / name).symlink_to(cached_model_dir(name), target_is_directory=True)
    old = os.environ.get("LASER_CACHE_DIR")
    os.environ["LASER_CACHE_DIR"] = str(tmp)
    yield tmp
    if old is None:
        os.environ.pop("LASER_CACHE_DIR", None)
    else:
        os.environ["LASER_CACHE_DIR"] = old


def fixed_cost(model: torch.nn.Module, *args, **kwargs):
    """A cost model of the shape the engine expects: a fixed forward plus a share per tree token."""
    from laser.cost import CONTEXT, NODES, ROWS, ForwardCost, cost_key

    seconds = [[0.004 + 0.0002 * r * n for n in NODES] for r in ROWS]
    return ForwardCost(cost_key(model), list(ROWS), list(NODES), seconds, CONTEXT)


@pytest.fixture(autouse=True)
def _premeasured_cost(monkeypatch):
    """Decoders with ``K: auto`` use :func:`fixed_cost` (tests of the cost model call laser.cost directly)."""
    import laser.decoders.base as base

    monkeypatch.setattr(base, "forward_cost", fixed_cost)


@pytest.fixture(scope="session")
def tiny_lm():
    lm = laser.tiny_llama(seed=3)
    lm.model.to(DEVICE)
    return lm


@pytest.fixture(scope="session")
def smollm():
    """The bundled SmolLM2-135M-Instruct in fp32 (de-quantised and cached on first use)."""
    return laser.load_model("smollm2-135m", device=DEVICE, dtype="float32")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """Path of a saved tiny random Llama with its tokenizer (jobs load it by path, like a hub model)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture
def ray_session():
    """Local Ray shared by the session's tests (2 CPUs), started on first use and again after a test that
    shut it down (the two-node cluster test does); yields its GCS address."""
    import ray

    if ray.is_initialized() and ray.cluster_resources().get("CPU", 0) < 2:  # a job run in-process started a smaller one
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray.get_runtime_context().gcs_address


@pytest.fixture(scope="session", autouse=True)
def _ray_shutdown():
    """Whatever started Ray in this process (a fixture, a job run in-process) is shut down at the end."""
    yield
    ray = sys.modules.get("ray")  # never imported: nothing to shut down (Ray need not be installed)
    if ray is not None and ray.is_initialized():
        ray.shutdown()


# ---- tiers: markers from the folder, run in order, timed -----------------------------------------


def _tier(item: pytest.Item) -> str:
    parts = Path(str(item.fspath)).parts
    return next((t for t in TIERS if t in parts), "unit")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item)))
    items.sort(key=lambda item: TIERS.index(_tier(item)))  # stable: file order kept inside a tier


_SECONDS: dict[str, float] = defaultdict(float)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.perf_counter()
    yield
    _SECONDS[_tier(item)] += time.perf_counter() - start


def pytest_terminal_summary(terminalreporter):
    if _SECONDS:
        terminalreporter.write_line(
            "time per tier: " + ", ".join(f"{t} {_SECONDS[t]:.0f}s" for t in TIERS if t in _SECONDS)
        )
