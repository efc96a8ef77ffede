"""Tiny random models for tests and examples (no download)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laser.models import LoadedModel


def tiny_llama(
    vocab_size: int = 96,
    hidden_size: int = 64,
    layers: int = 2,
    seed: int = 0,
    logit_scale: float = 8.0,
    eos_token_id: int = 1,
) -> LoadedModel:
    """A randomly initialised fp32 Llama whose output head is scaled up by ``logit_scale``.

    Scaling makes the next-token distribution peaked (drafts from the model's own texts get accepted),
    but it does not remove near-ties: a uniform scale keeps the relative order and margins of the
    logits. Greedy comparisons between differently shaped forwards can therefore still flip on a
    near-tie; :func:`argmax_margin` reports the margin when a test sees a flip.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos_token_id,
        bos_token_id=0,
        pad_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-llama-{seed}")


def argmax_margin(lm: LoadedModel, context: list[int]) -> float:
    """fp32 gap between the top two next-token logits after ``context``: how close a greedy step is to a tie."""
    with torch.no_grad():
        logits = lm.model(torch.tensor([context], device=lm.model.device)).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def first_divergence(lm: LoadedModel, prompt: list[int], got: list[int], want: list[int]) -> str:
    """Where two greedy continuations first differ, with the target's fp32 argmax margin there."""
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    if got == want:
        return "identical"
    margin = argmax_margin(lm, prompt + want[:i])
    return f"diverged at new token {i}: got {got[i : i + 3]}, want {want[i : i + 3]}; fp32 argmax margin {margin:.3g}"


def save_tiny_model(path: Path, hidden_size: int = 64) -> Path:
    """A tiny random Llama plus a byte-level tokenizer with a chat template, saved like a hub model.

    ``hidden_size=128`` gives 32-wide attention heads, the smallest vLLM's CPU attention supports.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = i + 2
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}\n>{% endif %}"
    )
    lm = tiny_llama(vocab_size=len(fast), hidden_size=hidden_size, seed=0, eos_token_id=1)
    lm.model.config.max_position_embeddings = 4096
    lm.model.save_pretrained(path)
    fast.save_pretrained(path)
    return path
