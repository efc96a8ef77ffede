"""Shared fixtures: tiny random Llama models (no download) and the bundled default model."""
from __future__ import annotations

import random

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


def greedy_reference(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding through transformers ``generate``."""
    out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


def random_prompts(n: int, vocab: int, seed: int = 0, length: tuple[int, int] = (4, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(*length))] for _ in range(n)]
