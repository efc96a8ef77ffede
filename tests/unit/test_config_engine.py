"""``execution.engine``: auto by default (vLLM where it is installed for the device and every decoder has a
vLLM form, else hf; ``LASER_ENGINE`` overrides auto); under vllm only decoders with a vLLM form pass,
others are a configuration error naming both keys; an actor's GPUs set its engine's tensor parallelism and
memory share. No vLLM needed (nothing here imports it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.config import ConfigError, load_config
from pipelines.config import JobConfig
from pipelines.knowledge.decoders import check_job_decoders
from pipelines.knowledge.validation import JobInputError


def test_auto_is_the_default_engine_and_resolves_by_what_is_installed(monkeypatch):
    from pipelines.knowledge import decoders

    cfg = load_config(None)
    assert cfg.execution.engine == "auto"
    monkeypatch.delenv(decoders.ENGINE_ENV, raising=False)
    monkeypatch.setattr(decoders, "vllm_build", lambda: "cpu")
    assert decoders.job_engine(cfg) == "vllm"
    assert decoders.job_engine(load_config(None, ["decoder.name=dsbd"])) == "hf"  # no vLLM form: hf runs the job
    assert decoders.job_engine(load_config(None, ["execution.gpus_per_worker=1"])) == "hf"  # a CPU build on a GPU job
    assert decoders.job_engine(load_config(None, ["generation.no_repeat_ngram_size=3"])) == "hf"  # a rule vLLM lacks
    monkeypatch.setattr(decoders, "vllm_build", lambda: None)
    assert decoders.job_engine(cfg) == "hf"


def test_the_environment_overrides_auto_only(monkeypatch):
    from pipelines.knowledge import decoders

    monkeypatch.setattr(decoders, "vllm_build", lambda: "cpu")
    monkeypatch.setenv(decoders.ENGINE_ENV, "hf")
    assert decoders.job_engine(load_config(None)) == "hf"
    assert decoders.job_engine(load_config(None, ["execution.engine=vllm"])) == "vllm"
    monkeypatch.setenv(decoders.ENGINE_ENV, "trt")
    with pytest.raises(JobInputError, match="LASER_ENGINE='trt'"):
        decoders.job_engine(load_config(None))


def test_an_unknown_engine_is_named():
    with pytest.raises(ConfigError, match=r"execution\.engine"):
        load_config(None, ["execution.engine=trt"])


@pytest.mark.parametrize("name", ["autoregressive", "laser", "resd"])
def test_decoders_with_a_vllm_form_pass(name):
    cfg = load_config(None, ["execution.engine=vllm", f"decoder.name={name}"])
    assert check_job_decoders(cfg).name == name


def test_a_decoder_without_a_vllm_form_is_refused_naming_both_keys():
    cfg = load_config(None, ["execution.engine=vllm", "decoder.name=spec_sampling", "decoder.params.draft=truncate:1"])
    with pytest.raises(JobInputError, match=r"execution\.engine=vllm: decoder\.name='spec_sampling' has no vllm form"):
        check_job_decoders(cfg)


def test_checking_a_vllm_config_does_not_import_vllm():
    """CI's environment has no vLLM: checking (and refusing) engine configs must not need it."""
    code = (
        "import sys; from jobs.config import load_config; from pipelines.knowledge.decoders import check_job_decoders; "
        "check_job_decoders(load_config(None, ['execution.engine=vllm'])); "
        "assert not any(m == 'vllm' or m.startswith(('vllm.', 'laser.vllm')) for m in sys.modules), 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_a_rule_without_a_vllm_form_is_refused_naming_both_keys():
    cfg = load_config(None, ["execution.engine=vllm", "generation.no_repeat_ngram_size=3"])
    with pytest.raises(JobInputError, match=r"execution\.engine=vllm: generation\.no_repeat_ngram_size"):
        check_job_decoders(cfg)


def test_an_actors_gpus_set_the_engines_tensor_parallel_size_and_memory_share():
    from pipelines.knowledge.engines.vllm import gpu_engine_args
    from pipelines.workers.actors import ModelSpec
    from pipelines.workers.layout import job_actors

    assert gpu_engine_args(ModelSpec("m")) == {}  # CPU: no GPU settings
    assert gpu_engine_args(ModelSpec("m", gpus=0.5)) == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.45}
    assert gpu_engine_args(ModelSpec("m", gpus=2)) == {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9}
    cfg = JobConfig.model_validate(
        {
            "execution": {
                "gpus_per_worker": 0.5,
                "gpu_memory_utilization": 0.4,
                "num_workers": 2,
                "threads_per_worker": 1,
            }
        }
    )
    spec, _ = job_actors(cfg)
    assert gpu_engine_args(spec)["gpu_memory_utilization"] == 0.4  # the job config's, carried to the actor
    with pytest.raises(ValidationError, match="more than an actor's share"):
        JobConfig.model_validate({"execution": {"gpus_per_worker": 0.5, "gpu_memory_utilization": 0.6}})


def test_the_worker_drives_the_engine_the_job_resolves_and_no_other(monkeypatch):
    """One place decides the engine (job_engine); the actors' spec carries it to the one registry."""
    from pipelines.knowledge import decoders, engines, job as jobmod

    monkeypatch.setenv(decoders.ENGINE_ENV, "vllm")
    assert jobmod.worker_group(load_config(None)).spec.engine == "vllm"
    monkeypatch.setenv(decoders.ENGINE_ENV, "hf")
    assert jobmod.worker_group(load_config(None)).spec.engine == "hf"
    assert set(engines.ENGINES) == {"hf", "vllm"}
    from pipelines.workers import ModelSpec

    with pytest.raises(ValueError, match="engine 'tgi': must be one of"):
        engines.build_adapter(ModelSpec("m", engine="tgi"))


def test_every_registered_engine_resolves_to_an_adapter_with_the_protocols_members():
    """The registry names classes by module path (imported when a worker builds one): each must exist and
    carry every member of EngineAdapter (mypy checks their signatures, engines/__init__.py)."""
    from importlib import import_module

    from pipelines.knowledge import engines
    from pipelines.knowledge.engines.base import EngineAdapter

    members = {n for n in vars(EngineAdapter) if not n.startswith("_")} | set(EngineAdapter.__annotations__)
    for name, where in engines.ENGINES.items():
        module, cls_name = where.split(":")
        cls = getattr(import_module(module), cls_name)
        assert cls.name == name
        missing = {m for m in members if not hasattr(cls, m) and m not in ("tokenizer", "model_name")}
        assert not missing, (name, missing)
