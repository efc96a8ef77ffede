"""A drafter that runs a small causal LM sharing the target's vocabulary: a chain of ``gamma`` tokens per
step, each with its full draft distribution, from the draft model's own KV cache.

The draft cache holds the context except its last token, as the target's does. After verification it is
cropped to the context plus the accepted drafts (a rewind, never a recompute); the next proposal feeds
only what the draft has not seen (the bonus token, and the last draft when every draft was accepted).
At temperature 0 drafts are the draft model's argmax; above it they are sampled from the draft's
distribution under the request's sampling settings, with a generator of the drafter's own.
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache

from laser.drafting import Drafter
from laser.sampling import GREEDY, SamplingParams, sample, target_probs
from laser.tree import DraftTree


class ModelDrafter(Drafter):
    """Per-request draft-model state: its cache, the context it covers, the drafts of the last proposal."""

    def __init__(self, model: torch.nn.Module, prompt_ids: Sequence[int], gamma: int,
                 sampling: SamplingParams = GREEDY):
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.model, self.gamma, self.sampling = model, gamma, sampling
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.cached = 0  # context tokens whose KV is in the draft cache
        self.context = list(prompt_ids)
        self.drafts: list[int] = []
        self.generator = SamplingParams(seed=sampling.seed + 1).generator()

    @torch.inference_mode()
    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        gamma = self.gamma if budget is None else min(self.gamma, budget)
        if gamma == 0:
            self.drafts = []
            return DraftTree.chain(context[-1])
        feed = list(context[self.cached:])  # at least the root
        drafts, dists = [], []
        for _ in range(gamma):
            logits = self._forward(feed)
            q = target_probs(logits, self.sampling)
            tok = int(q.argmax()) if self.sampling.greedy else sample(q, self.generator)
            drafts.append(tok)
            dists.append(q)
            feed = [tok]
        self.drafts = drafts
        return DraftTree.chain(context[-1], drafts, torch.stack(dists))

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Next-token logits ``[V]`` after feeding ``ids`` on top of the cache."""
        out = self.model(input_ids=torch.tensor([ids], device=self.device), past_key_values=self.cache, use_cache=True)
        return out.logits[0, -1]

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        """Keep the cache of the context plus the drafts the target accepted; drop the rest."""
        accepted = 0
        for tok, draft in zip(new_tokens[:-1], self.drafts):
            if tok != draft:
                break
            accepted += 1
        # the cache holds context + drafts[:-1]; keep context + the accepted drafts among those
        keep = len(self.context) + min(accepted, max(len(self.drafts) - 1, 0))
        drop = self.cache.get_seq_length() - keep
        if drop > 0:
            self.cache.crop(-drop)
        self.cached = keep
        self.context.extend(new_tokens)

    def close(self) -> None:
        self.cache = DynamicCache()


def truncated_copy(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """A draft made of the target's embeddings, first ``layers`` decoder layers, final norm and head
    (weights copied; the target is untouched)."""
    import copy

    from transformers import AutoModelForCausalLM

    total = model.config.num_hidden_layers
    if not 1 <= layers <= total:
        raise ValueError(f"layers must lie in [1, {total}], got {layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    draft = AutoModelForCausalLM.from_config(config).to(next(model.parameters()).dtype)
    draft.load_state_dict(model.state_dict(), strict=False)  # the deeper layers' weights are not needed
    return draft.to(next(model.parameters()).device).eval()
