"""Shared fixtures: tiny random Llama models (no download), the bundled default model, a Ray session."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import laser


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_lm():
    return laser.tiny_llama(seed=3)


@pytest.fixture(scope="session")
def smollm():
    """The bundled SmolLM2-135M-Instruct in fp32 on CPU (de-quantised and cached on first use)."""
    return laser.load_model("smollm2-135m", device="cpu", dtype="float32")


def save_tiny_model(path: Path) -> Path:
    """A tiny random Llama plus a byte-level tokenizer with a chat template, saved like a hub model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import laser

    vocab = {"<s>": 0, "</s>": 1}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = i + 2
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}\n>{% endif %}"
    lm = laser.tiny_llama(vocab_size=len(fast), seed=0, eos_token_id=1)
    lm.model.config.max_position_embeddings = 4096
    lm.model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """Path of a saved tiny random Llama with its tokenizer (jobs load it by path, like a hub model)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def ray_session():
    """Local Ray for one test module (2 CPUs); yields its GCS address."""
    import ray

    if ray.is_initialized():  # a job run in-process by an earlier test module left its local Ray up
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def greedy_reference(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding through transformers ``generate``."""
    out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


def random_prompts(n: int, vocab: int, seed: int = 0, length: tuple[int, int] = (4, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(*length))] for _ in range(n)]
