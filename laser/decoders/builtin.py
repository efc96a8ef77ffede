"""Built-in decoders: autoregressive, ReSD (global pool, greedy) and LASER (routed pool, relaxed or greedy).

At temperature 0 the greedy ones reproduce the target's greedy decoding; above it they sample exactly
from the target (rejection sampling with the trie drafts as one-hot proposals).
"""

from __future__ import annotations

from typing import Any

from laser.decoders.base import Decoder, RetrievalDecoder
from laser.decoders.registry import register_decoder
from laser.defaults import N_MAX, RELAXED_K, RELAXED_P
from laser.models import LoadedModel
from laser.sampling import SamplingParams
from laser.verify import RejectionSampler, TopKVerifier, Verifier


@register_decoder
class Autoregressive(Decoder):
    name = "autoregressive"
    summary = "one token per target forward, on the same model-call path as the speculative decoders"
    pool = "none"
    engines = ("hf", "vllm")


@register_decoder
class ReSD(RetrievalDecoder):
    name = "resd"
    summary = "retrieval speculative decoding: trie drafts from one global pool, greedy (lossless) verification"
    pool = "global"
    engines = ("hf", "vllm")


@register_decoder
class Laser(RetrievalDecoder):
    name = "laser"
    summary = "LASER: trie drafts from the request's routed pool, relaxed (top-k and p) or greedy verification"
    pool = "routed"
    engines = ("hf", "vllm")

    def __init__(
        self,
        lm: LoadedModel,
        verification: str = "relaxed",
        k: int = RELAXED_K,
        p: float = RELAXED_P,
        K: int | str | None = None,
        n_max: int = N_MAX,
        min_prob: float = 0.0,
    ):
        super().__init__(lm, K=K, n_max=n_max, min_prob=min_prob)
        if verification not in ("relaxed", "greedy"):
            raise ValueError(f"verification must be 'relaxed' or 'greedy', got {verification!r}")
        TopKVerifier(k, p)  # validates k and p even when greedy
        self.verification, self.k, self.p = verification, k, p

    @classmethod
    def greedy_params(cls) -> dict[str, Any]:
        return {"verification": "greedy"}

    def verifier(self) -> Verifier:
        return TopKVerifier(self.k, self.p) if self.verification == "relaxed" else RejectionSampler()

    def runs_greedy_of(self, other: Decoder) -> bool:
        # relaxed rows and greedy ones share the drafts and the budget; TopKVerifier holds exact rows to k=1
        return (
            self.verification == "relaxed"
            and type(other) is type(self)
            and other.verification == "greedy"
            and {**other.params(), "verification": "relaxed", "k": self.k, "p": self.p} == self.params()
        )

    @classmethod
    def refuse_sampling(cls, sampling: SamplingParams, params: dict[str, Any]) -> None:
        if params.get("verification", "relaxed") == "relaxed" and not sampling.greedy:
            raise ValueError(
                "relaxed verification is deterministic: use temperature 0, or verification='greedy' "
                "to sample exactly from the target"
            )

    def params(self) -> dict[str, Any]:
        return {"verification": self.verification, "k": self.k, "p": self.p, **super().params()}
