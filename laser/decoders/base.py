"""The decoder interface: a request in, a generation with stats out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from laser.drafting import DraftSource, Drafter, NoDrafter
from laser.engine import DecodeStats, Request, TreeDecodingEngine
from laser.models import LoadedModel
from laser.verify import TopKVerifier

Prompt = str | Sequence[int]


def draft_defaults(device: torch.device) -> tuple[int, float]:
    """Draft budget ``(K, min_prob)`` when a decoder is not given one.

    On a GPU extra tree tokens are nearly free, so the paper's 64 nodes and no probability floor. On a
    CPU every tree token costs forward time (a 64-node step about 3x a one-token step on 2 cores, see
    the draft-budget study of `laser bench suite`), so fewer, likelier nodes: 32 with ``min_prob`` 0.1.
    """
    return (64, 0.0) if device.type == "cuda" else (32, 0.1)


@dataclass
class Generation:
    token_ids: list[int]  # generated tokens only (the end-of-sequence token included when reached)
    text: str
    stats: DecodeStats


class Decoder:
    """Base class: subclasses say how to verify and where drafts come from.

    ``generate`` decodes one request, ``generate_batch`` several in one padded batch. ``K`` and
    ``min_prob`` default to :func:`draft_defaults` for the model's device. A ``pool`` is any
    :class:`laser.drafting.DraftSource` (e.g. ``pools.RetrievalPool``); without one every step drafts
    nothing and decoding is autoregressive.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def __init__(self, lm: LoadedModel, K: int | None = None, n_max: int = 8, min_prob: float | None = None):
        auto_K, auto_min_prob = draft_defaults(next(lm.model.parameters()).device)
        K = auto_K if K is None else K
        min_prob = auto_min_prob if min_prob is None else min_prob
        if K < 0 or n_max < 1:
            raise ValueError(f"K must be >= 0 and n_max >= 1, got K={K}, n_max={n_max}")
        if not 0.0 <= min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {min_prob}")
        self.lm, self.K, self.n_max, self.min_prob = lm, K, n_max, min_prob
        self.engine = TreeDecodingEngine(lm.model, self.verifier(), lm.eos_ids)

    def verifier(self) -> TopKVerifier:
        return TopKVerifier(k=1)

    def params(self) -> dict[str, Any]:
        """The decoder's settings, recorded with every generated row."""
        return {"K": self.K, "n_max": self.n_max, "min_prob": self.min_prob}

    def drafter(self, pool: DraftSource | None, prompt_ids: list[int]) -> Drafter:
        if pool is None or self.K == 0:
            return NoDrafter()
        return pool.open(prompt_ids, max_nodes=self.K, n_max=self.n_max, min_prob=self.min_prob)

    def generate(self, prompt: Prompt, max_new_tokens: int = 256, pool: DraftSource | None = None) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, [pool])[0]

    def generate_batch(self, prompts: Sequence[Prompt], max_new_tokens: int = 256,
                       pools: Sequence[DraftSource | None] | None = None) -> list[Generation]:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        pools = list(pools) if pools is not None else [None] * len(prompts)
        if len(pools) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(pools)} pools")
        ids = [self.encode(p) for p in prompts]
        seqs = [Request(tokens=list(t), prompt_len=len(t), drafter=self.drafter(pool, t), max_new_tokens=max_new_tokens)
                for t, pool in zip(ids, pools)]
        self.engine.run(seqs)
        return [Generation(s.new_tokens, self.decode(s.new_tokens), s.stats) for s in seqs]

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text becomes one user chat message (chat template applied)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt")
            if self.lm.tokenizer is None:
                raise ValueError(f"model {self.lm.name!r} has no tokenizer: pass token ids")
            ids = self.lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                        add_generation_prompt=True, tokenize=True, return_dict=False)
            ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        else:
            ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError("empty prompt")
        if len(ids) >= self.lm.context_length:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's context of {self.lm.context_length}")
        return ids

    def decode(self, token_ids: list[int]) -> str:
        tok = self.lm.tokenizer
        return tok.decode(token_ids, skip_special_tokens=True) if tok is not None else ""
