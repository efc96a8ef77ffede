"""Helpers shared by the test tiers: tiny saved models, the target's own greedy decoding, random prompts."""
from __future__ import annotations

import random
from pathlib import Path

import torch


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


def greedy_reference(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding through transformers ``generate``."""
    out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


def random_prompts(n: int, vocab: int, seed: int = 0, length: tuple[int, int] = (4, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(*length))] for _ in range(n)]
