"""What the vLLM plug-in needs from vLLM, read from source (laser.vllm.requirements): a minimal vLLM written
here passes, and each need removed from it is named in one line; the installed vLLM passes."""

from __future__ import annotations

import importlib.util
import logging
import zipfile

import pytest

from laser.vllm import plugin
from laser.vllm.requirements import Source, check, wheel_source

# the smallest vLLM source that has everything the plug-in uses
MINIMAL = {
    "vllm._version": "__version__ = version = '0.30.1'\n",
    "vllm.v1.worker.gpu_model_runner": """
class GPUModelRunner:
    def __init__(self, vllm_config, device):
        self.device = device
        self.speculative_config = vllm_config.speculative_config
        self.sampler = object()
        self.rejection_sampler = object()
        self.input_batch: object = None
        self.requests = {}
        if self.speculative_config.method == "custom_class":
            self.drafter = make()

    def propose_draft_token_ids(self, spec_config, sampled):
        if spec_config.method == "ngram":
            self.drafter.propose(1, 2, 3, 4, 5)
        elif spec_config.method == "custom_class":
            draft = self.drafter.propose(sampled, self.input_batch.n, self.input_batch.ids, slot_mappings=None)
""",
    "vllm.v1.sample.rejection_sampler": """
class RejectionSampler:
    def __init__(self, sampler, spec_config=None, device=None): ...
    def forward(self, metadata, draft_probs, logits, sampling_metadata): ...
    def apply_logits_processors(self, logits, sampling_metadata, metadata): ...
""",
    "vllm.v1.spec_decode.custom_class_proposer": "def create_custom_proposer(vllm_config): ...\n",
    "vllm.v1.spec_decode.metadata": """
@dataclass
class SpecDecodeMetadata:
    draft_token_ids: object
    num_draft_tokens: list
    cu_num_draft_tokens: object
""",
    "vllm.v1.sample.metadata": "class SamplingMetadata:\n    max_num_logprobs: int | None\n",
    "vllm.engine.arg_utils": "class EngineArgs:\n    model: str = ''\n",
    "vllm.sampling_params": """
class RequestOutputKind: ...
class SamplingParams:
    extra_args: dict | None = None
    output_kind: RequestOutputKind = None

    def verify(self, model_config, speculative_config, structured_outputs_config, tokenizer): ...
""",
    "vllm.exceptions": "class VLLMValidationError(ValueError): ...\n",
    "vllm.v1.engine.core_client": "class InprocClient: ...\n",
    "vllm.v1.engine.exceptions": "class EngineDeadError(Exception): ...\n",
}


def source(files: dict[str, str]) -> Source:
    return Source("0.30.1", files.get)


def test_a_vllm_with_every_need_passes_and_reports_its_features():
    report = check(source(MINIMAL))
    assert report.ok and report.tested and report.features == {"per_request_spec_decode_metrics": False}
    newer = {
        **MINIMAL,
        "vllm.engine.arg_utils": MINIMAL["vllm.engine.arg_utils"]
        + "    per_request_spec_decode_metrics: str = 'none'\n",
    }
    assert check(source(newer)).features["per_request_spec_decode_metrics"]


@pytest.mark.parametrize(
    ("module", "old", "new", "named"),
    [
        (
            "vllm.v1.sample.rejection_sampler",
            "def apply_logits_processors",
            "def apply_processors",
            "RejectionSampler.apply_logits_processors: not defined",
        ),
        (
            "vllm.v1.sample.rejection_sampler",
            "(self, metadata, draft_probs, logits",
            "(self, metadata, logits",
            "RejectionSampler.forward: parameters are",
        ),
        (
            "vllm.v1.spec_decode.metadata",
            "num_draft_tokens: list",
            "n_draft: list",
            "SpecDecodeMetadata: has no field(s) ['num_draft_tokens']",
        ),
        (
            "vllm.v1.worker.gpu_model_runner",
            "self.requests = {}",
            "requests = {}",
            "GPUModelRunner.__init__: does not set self.requests",
        ),
        (
            "vllm.v1.worker.gpu_model_runner",
            "slot_mappings=None",
            "slots=None",
            "propose call: propose is called with 3 positional and keywords ['slots']",
        ),
        (
            "vllm.v1.worker.gpu_model_runner",
            '== "custom_class"',
            '== "custom"',
            "no propose call under a custom_class branch",
        ),
        ("vllm.v1.sample.metadata", "max_num_logprobs", "max_logprobs", "SamplingMetadata: has no field(s)"),
    ],
)
def test_each_missing_need_is_named_in_one_line(module, old, new, named):
    assert old in MINIMAL[module]
    files = {**MINIMAL, module: MINIMAL[module].replace(old, new)}
    line = plugin.check_vllm(source(files))
    assert line is not None and named in line and "\n" not in line and "0.30.1" in line


def test_a_missing_module_is_named():
    files = {k: v for k, v in MINIMAL.items() if k != "vllm.v1.spec_decode.custom_class_proposer"}
    assert "custom_class_proposer.create_custom_proposer: no such module" in plugin.check_vllm(source(files))


def test_a_version_outside_the_tested_range_is_used_with_a_warning(caplog):
    files = {**MINIMAL, "vllm._version": "__version__ = version = '0.40.0'\n"}
    with caplog.at_level(logging.WARNING, logger="laser.vllm.plugin"):
        assert plugin.check_vllm(Source("0.40.0", files.get)) is None
    assert "0.40.0" in caplog.text and "0.26-0.33" in caplog.text


def test_a_wheel_is_read_without_installing_it(tmp_path):
    wheel = tmp_path / "vllm-0.30.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for module, text in MINIMAL.items():
            z.writestr(module.replace(".", "/") + ".py", text)
    src = wheel_source(wheel)
    assert src.version == "0.30.1" and check(src).ok


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_installed_vllm_passes():
    assert plugin.check_vllm() is None
