"""Config errors that teach: "did you mean" for unknown keys (ours, vLLM's and transformers' names), and the
model keys as vLLM and transformers know them (revision, trust_remote_code, max_model_len, engine_args)."""

from __future__ import annotations

import pytest

from jobs.config import ConfigError, load_config
from pipelines.config import JobConfig
from pipelines.config import vllm_engine_arg_names
from pipelines.workers.layout import job_actors


def _error(overrides: list[str], path=None) -> list[str]:
    """The error lines of a config that fails (the first line names the source)."""
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    return str(err.value).splitlines()[1:]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("generation.max_tokens", "generation.max_new_tokens"),
        ("generation.stop", "generation.stop_strings"),
        ("execution.tensor_parallel_size", "execution.gpus_per_worker"),
        ("execution.max_num_seqs", "execution.batch_size"),
        ("model.model_name", "model.name"),
        ("model_id", "model.name"),
        ("generation.min_tokens", "generation.min_new_tokens"),
        ("execution.num_speculative_tokens", "decoder.params.K"),
        ("generation.temprature", "generation.temperature"),  # a near key of the block
        ("decoder.top_p", "generation.top_p"),  # the same name in another block
        ("dataset.limt_users", "dataset.limit_users"),
    ],
)
def test_unknown_key_says_what_it_may_mean(key, hint):
    assert _error([f"{key}=1"]) == [f"  {key}: unknown key; did you mean {hint}?"]


def test_yaml_file_gets_the_same_hints(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("generation:\n  max_tokens: 64\n  stop: ['\\n']\n")
    assert _error([], path) == [
        "  generation.max_tokens: unknown key; did you mean generation.max_new_tokens?",
        "  generation.stop: unknown key; did you mean generation.stop_strings?",
    ]


def test_a_key_with_no_near_match_has_no_hint():
    assert _error(["generation.zzz_unrelated=1", "qqq=2"]) == [
        "  generation.zzz_unrelated: unknown key",
        "  qqq: unknown key",
    ]


needs_vllm = pytest.mark.skipif(vllm_engine_arg_names() is None, reason="vLLM is not installed")


@needs_vllm
def test_a_vllm_argument_outside_engine_args_is_pointed_there():
    assert _error(["model.quantization=fp8"]) == [
        "  model.quantization: unknown key; vLLM's own engine argument 'quantization' goes under model.engine_args"
    ]


@needs_vllm
def test_engine_args_checked_against_vllm_names():
    cfg = load_config(None, ["model.engine_args={quantization: fp8, kv_cache_dtype: auto}"])
    assert cfg.model.engine_args == {"quantization": "fp8", "kv_cache_dtype": "auto"}
    (line,) = _error(["model.engine_args={enable_chunked_prefil: true}"])
    assert line.startswith("  model.engine_args.enable_chunked_prefil: ")
    assert "not one of vLLM's engine arguments" in line and "did you mean 'enable_chunked_prefill'?" in line
    (line,) = _error(["model.engine_args={zzz_unrelated: 1}"])
    assert "did you mean" not in line


def test_engine_args_the_job_sets_are_refused_naming_both():
    lines = _error(["model.engine_args={max_num_seqs: 4, tensor_parallel_size: 2, max_model_len: 512}"])
    assert lines == [
        "  model.engine_args.max_num_seqs: Value error, the job sets vLLM's max_num_seqs itself, from "
        "execution.batch_size: set it there",
        "  model.engine_args.tensor_parallel_size: Value error, the job sets vLLM's tensor_parallel_size itself, "
        "from execution.gpus_per_worker: set it there",
        "  model.engine_args.max_model_len: Value error, the job sets vLLM's max_model_len itself, from "
        "model.max_model_len: set it there",
    ]


def test_engine_args_with_engine_hf_is_an_error():
    (line,) = _error(["model.engine_args={quantization: fp8}", "execution.engine=hf"])
    assert line == (
        "  execution: Value error, engine hf takes no vLLM engine arguments (model.engine_args.quantization): "
        "remove them or set engine: vllm"
    )


def test_max_model_len_must_hold_the_generation():
    (line,) = _error(["model.max_model_len=1000"])  # default 1024 prompt + 256 new tokens
    assert "generation.max_prompt_tokens 1024 + max_new_tokens 256 exceed model.max_model_len 1000" in line
    assert "(got" not in line  # the whole block is not printed
    assert load_config(None, ["model.max_model_len=1280"]).model.max_model_len == 1280


def test_model_keys_reach_the_actors_spec_and_vllm():
    from pipelines.knowledge.engines.vllm import model_engine_args

    over = ["model.revision=abc123", "model.trust_remote_code=true", "model.max_model_len=4096"]
    cfg = load_config(None, [*over, "model.engine_args={quantization: fp8}"])
    spec, _ = job_actors(cfg, engine="vllm")
    assert (spec.revision, spec.trust_remote_code, spec.max_model_len) == ("abc123", True, 4096)
    assert spec.loading() == {"revision": "abc123", "trust_remote_code": True}  # transformers' from_pretrained
    assert model_engine_args(spec) == {
        "revision": "abc123",
        "tokenizer_revision": "abc123",
        "trust_remote_code": True,
        "max_model_len": 4096,
        "quantization": "fp8",
    }
    default = job_actors(JobConfig(), engine="vllm")[0]
    assert model_engine_args(default) == {"trust_remote_code": False, "max_model_len": None}  # the model's own


def test_engine_args_when_auto_picks_hf(monkeypatch):
    from pipelines.knowledge import decoders
    from pipelines.knowledge.validation import JobInputError

    monkeypatch.delenv(decoders.ENGINE_ENV, raising=False)
    monkeypatch.setattr(decoders, "vllm_build", lambda: None)  # no vLLM for the device: auto is hf
    assert decoders.job_engine(JobConfig()) == "hf"
    with pytest.raises(JobInputError, match=r"model\.engine_args \(quantization\) are vLLM's.*auto chose hf"):
        decoders.job_engine(load_config(None, ["model.engine_args={quantization: fp8}"]))


def test_model_keys_hash_only_when_set():
    base = JobConfig().resolved_run_id()
    assert base == JobConfig.model_validate({"model": {"trust_remote_code": False}}).resolved_run_id()
    assert base != JobConfig.model_validate({"model": {"revision": "abc123"}}).resolved_run_id()


def test_a_decoder_parameter_gets_a_near_name_or_the_generation_key():
    from pipelines.knowledge.decoders import resolve_job_decoder
    from pipelines.knowledge.validation import JobInputError

    with pytest.raises(JobInputError, match=r"decoder\.params\.nmax: .*; did you mean 'n_max'\?"):
        resolve_job_decoder("laser", {"nmax": 4})
    with pytest.raises(JobInputError, match=r"decoder\.params\.top_p: .*; the job's top_p is generation\.top_p"):
        resolve_job_decoder("laser", {"top_p": 0.9})
    with pytest.raises(JobInputError) as no_hint:
        resolve_job_decoder("laser", {"zzz": 1})
    assert "did you mean" not in str(no_hint.value) and "generation." not in str(no_hint.value)
