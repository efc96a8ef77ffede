"""Generation actors reserve GPUs through Ray (a fake GPU resource on this CPU machine) and load the model
on the device that follows from it."""

from __future__ import annotations

import os

import pytest

from jobs.config import ConfigError, load_config
from pipelines.knowledge.generation import GenerationWorker
from pipelines.workers import ModelSpec, WorkerGroup


class Probe:
    """Stands in for the model-holding actor: reports what Ray gave it."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def ready(self, slots: int) -> dict:
        return {}

    def resources(self) -> tuple[dict, list, str | None]:
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_assigned_resources(), ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.fixture(scope="module")
def fake_gpu_ray():
    import ray

    here = os.path.dirname(os.path.abspath(__file__))  # actors import this module (Probe) and this checkout
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([os.path.dirname(here), here])}}
    if ray.is_initialized():  # a job run in-process by an earlier test module left its local Ray up
        ray.shutdown()
    ray.init(
        num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=env
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_fractional_gpus_share_one_gpu_and_more_wait(fake_gpu_ray):
    ray = fake_gpu_ray
    group = WorkerGroup(Probe, ModelSpec("m", threads=1, gpus=0.5), num_workers=2)
    group.start(slots=1, n=2)
    got = ray.get([a.resources.remote() for a in group.actors])
    assert [g[0] for g in got] == [{"CPU": 1.0, "GPU": 0.5}] * 2
    assert all(g[1] == [0] and g[2] == "0" for g in got)  # both see GPU 0
    assert ray.available_resources().get("GPU", 0.0) == 0.0
    extra = WorkerGroup(Probe, ModelSpec("m", threads=1, gpus=0.5), num_workers=1)
    extra.start(slots=1, n=1)
    ready, _ = ray.wait([extra.actors[0].resources.remote()], timeout=3)
    assert not ready  # no GPU share left: the third actor waits for one
    extra.close()
    group.close()


@pytest.mark.slow
def test_cpu_actors_reserve_no_gpu_and_see_none(fake_gpu_ray):
    ray = fake_gpu_ray
    group = WorkerGroup(Probe, ModelSpec("m", threads=1), num_workers=1)
    group.start(slots=1, n=1)
    assigned, gpu_ids, visible = ray.get(group.actors[0].resources.remote())
    group.close()
    assert assigned == {"CPU": 1.0} and gpu_ids == []  # no GPU share: Ray gives it no device


def test_device_follows_gpus_and_config_passes_them():
    from pipelines.knowledge import job as jobmod

    assert ModelSpec("m").device == "cpu" and ModelSpec("m", gpus=0.25).device == "cuda"
    cfg = load_config(None, ["execution.gpus_per_worker=0.5", "execution.threads_per_worker=2"])
    spec = jobmod.worker_group(cfg).spec
    assert (spec.gpus, spec.threads, spec.device) == (0.5, 2, "cuda")
    with pytest.raises(ConfigError, match="whole number"):
        load_config(None, ["execution.gpus_per_worker=1.5"])
    assert load_config(None, ["execution.gpus_per_worker=2"]).execution.gpus_per_worker == 2


def test_worker_without_cuda_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"gpus_per_worker=0.5 but this node has no usable CUDA GPU"):
        GenerationWorker(ModelSpec("smollm2-135m", gpus=0.5))
