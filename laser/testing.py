"""Tiny random models for tests and examples (no download)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laser.models import LoadedModel


def tiny_llama(vocab_size: int = 96, hidden_size: int = 64, layers: int = 2, seed: int = 0,
               logit_scale: float = 8.0, eos_token_id: int = 1) -> LoadedModel:
    """A randomly initialised fp32 Llama whose output head is scaled up so logits are peaked.

    Peaked logits keep the argmax away from near-ties, so greedy comparisons between differently
    shaped (but mathematically equal) forwards are exact.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, eos_token_id=eos_token_id, bos_token_id=0, pad_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-llama-{seed}")
