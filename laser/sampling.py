"""Sampling settings and the target distribution they define, applied as ``generate`` applies them.

Temperature 0 means greedy: the target distribution is one-hot at the argmax. Otherwise the logits are
divided by the temperature, then top-k and top-p filtered (transformers' own warpers, in ``generate``'s
order), then softmaxed. Every request samples from its own seeded ``torch.Generator``, so a run, and a
resumed run, draws the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 = greedy; ``top_k`` 0 and ``top_p`` 1 = no filtering; ``seed`` of the request's generator."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator:
        """A CPU generator seeded for one request (CPU, so draws do not depend on the device)."""
        return torch.Generator().manual_seed(int(self.seed))

    def as_dict(self) -> dict[str, float | int]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


GREEDY = SamplingParams()


def target_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """``[..., V]`` fp32 probabilities of the next token under ``sampling`` (one-hot argmax when greedy)."""
    # transformers' warpers load on the first sampled step: a driver that only reads sampling settings needs
    # none of transformers
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = logits.float()
    if sampling.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    shape = logits.shape
    scores = logits.reshape(-1, shape[-1])
    scores = TemperatureLogitsWarper(sampling.temperature)(None, scores)
    if sampling.top_k > 0:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    probs: torch.Tensor = scores.softmax(-1).reshape(shape)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from a ``[V]`` distribution with the request's generator."""
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator))
