"""A drafter that runs a small causal LM sharing the target's vocabulary: a chain of ``gamma`` tokens per
step, each with its full draft distribution, from the draft model's own KV cache.

The draft cache holds the context except its last token, as the target's does. After verification it is
cropped to the context plus the accepted drafts (a rewind, never a recompute); the next proposal feeds
only what the draft has not seen (the bonus token, and the last draft when every draft was accepted).
At temperature 0 drafts are the draft model's argmax; above it they are sampled from the draft's
distribution under the request's sampling settings, with a generator of the drafter's own.

Batching (``propose_batch``): the requests of a step that share a draft model draft together, one draft
forward per draft position. Their caches are stacked right-padded into one batch cache (a 4D mask hides
padding, position ids count each row's own tokens) and each row's entries are gathered back into its
own cache afterwards: a copy of the draft caches per step, simpler than one long-lived batch cache
whose rows would have to follow the engine's batch as requests finish. A single request skips it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from laser.drafting import Drafter
from laser.kv_cache import layer_kv
from laser.models import move_model
from laser.sampling import GREEDY, SamplingParams, sample, target_probs
from laser.tree import DraftTree, additive_mask


class ModelDrafter(Drafter):
    """Per-request draft-model state: its cache, the context it covers, the drafts of the last proposal."""

    def __init__(
        self, model: torch.nn.Module, prompt_ids: Sequence[int], gamma: int, sampling: SamplingParams = GREEDY
    ):
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.model, self.gamma, self.sampling = model, gamma, sampling
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.cached = 0  # context tokens whose KV is in the draft cache
        self.context = list(prompt_ids)
        self.drafts: list[int] = []
        self.generator = SamplingParams(seed=sampling.seed + 1).generator()

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        return self.propose_batch([self], [context], [budget])[0]

    @classmethod
    @torch.inference_mode()
    def propose_batch(
        cls, drafters: Sequence["ModelDrafter"], contexts: Sequence[Sequence[int]], budgets: Sequence[int | None]
    ) -> list[DraftTree]:
        """Chains for several requests: drafters sharing a draft model advance together, one draft
        forward per draft position for all of them."""
        trees: dict[int, DraftTree] = {}
        groups: dict[int, list[int]] = defaultdict(list)
        gammas = [d.gamma if b is None else min(d.gamma, b) for d, b in zip(drafters, budgets)]
        for i, (d, g) in enumerate(zip(drafters, gammas)):
            if g <= 0:
                d.drafts = []
                trees[i] = DraftTree.chain(contexts[i][-1])
            else:
                groups[id(d.model)].append(i)
        for rows in groups.values():
            made = _draft_together([drafters[i] for i in rows], [contexts[i] for i in rows], [gammas[i] for i in rows])
            trees.update(zip(rows, made))
        return [trees[i] for i in range(len(drafters))]

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


def truncated_copy(model: PreTrainedModel, layers: int) -> PreTrainedModel:
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
    draft: PreTrainedModel = AutoModelForCausalLM.from_config(config).to(next(model.parameters()).dtype)
    draft.load_state_dict(model.state_dict(), strict=False)  # the deeper layers' weights are not needed
    draft = move_model(draft, next(model.parameters()).device)
    draft.eval()
    return draft


def _draft_together(
    drafters: Sequence[ModelDrafter], contexts: Sequence[Sequence[int]], gammas: Sequence[int]
) -> list[DraftTree]:
    """Draft ``gammas[i]`` tokens for each drafter (all sharing one draft model), position by position.

    The first forward feeds what each draft cache lacks (at least the root); each later one feeds the
    previous draft of the rows that still draft (the others feed a hidden filler). The draft cache ends
    holding context + drafts[:-1], as :meth:`ModelDrafter.commit` expects.
    """
    batch = _RowCache(drafters[0]) if len(drafters) == 1 else _StackedCache(drafters)
    logits = batch.forward([list(c[d.cached :]) for d, c in zip(drafters, contexts)], [True] * len(drafters))
    drafts: list[list[int]] = [[] for _ in drafters]
    dists: list[list[torch.Tensor]] = [[] for _ in drafters]
    for t in range(max(gammas)):
        for i, d in enumerate(drafters):
            if t < gammas[i]:
                q = target_probs(logits[i], d.sampling)
                drafts[i].append(int(q.argmax()) if d.sampling.greedy else sample(q, d.generator))
                dists[i].append(q)
        if t + 1 == max(gammas):
            break
        logits = batch.forward([[row[-1]] for row in drafts], [t + 1 < g for g in gammas])
    batch.write_back(drafters)
    for d, row in zip(drafters, drafts):
        d.drafts = row
    return [DraftTree.chain(c[-1], row, torch.stack(q)) for c, row, q in zip(contexts, drafts, dists)]


class _RowCache:
    """One request: feed its own cache directly (no padding, no mask)."""

    def __init__(self, drafter: ModelDrafter):
        self.drafter = drafter

    def forward(self, feeds: list[list[int]], live: list[bool]) -> torch.Tensor:
        d = self.drafter
        out = d.model(input_ids=torch.tensor(feeds, device=d.device), past_key_values=d.cache, use_cache=True)
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def write_back(self, drafters: Sequence[ModelDrafter]) -> None:
        pass


class _StackedCache:
    """Several requests' draft caches stacked right-padded into one batch cache for one proposal.

    ``valid[b, s]`` says whether slot ``s`` holds row ``b``'s own context (padding and the fillers of
    rows that stopped drafting do not); a 4D additive mask hides the rest, and position ids count each
    row's valid slots. ``write_back`` gathers every row's valid slots into its own ``DynamicCache``.
    """

    def __init__(self, drafters: Sequence[ModelDrafter]):
        d0 = drafters[0]
        self.model, self.device = d0.model, d0.device
        self.dtype = next(d0.model.parameters()).dtype
        lens = [d.cache.get_seq_length() for d in drafters]
        width = max(lens)
        self.cache = DynamicCache()
        self.valid = torch.arange(width, device=self.device)[None, :] < torch.tensor(lens, device=self.device)[:, None]
        self.next_pos = torch.tensor(lens, device=self.device)
        if width == 0:
            return
        ref = next(d.cache for d, n in zip(drafters, lens) if n == width)
        for layer, ref_layer in enumerate(ref.layers):
            ref_keys, ref_values = layer_kv(ref_layer)
            keys = ref_keys.new_zeros(len(drafters), *ref_keys.shape[1:])
            values = ref_values.new_zeros(len(drafters), *ref_values.shape[1:])
            for b, (d, n) in enumerate(zip(drafters, lens)):
                if n:
                    own_keys, own_values = layer_kv(d.cache.layers[layer])
                    keys[b, :, :n] = own_keys[0]
                    values[b, :, :n] = own_values[0]
            self.cache.update(keys, values, layer)

    def forward(self, feeds: list[list[int]], live: list[bool]) -> torch.Tensor:
        """Next-token logits ``[B, V]`` after each row's feed (rows not ``live`` feed hidden fillers)."""
        width = max(len(f) for f in feeds)
        lens = torch.tensor([len(f) for f in feeds], device=self.device)
        ids = torch.tensor([f + [f[-1]] * (width - len(f)) for f in feeds], device=self.device)
        cols = torch.arange(width, device=self.device)
        ok = (cols[None, :] < lens[:, None]) & torch.tensor(live, device=self.device)[:, None]  # [B, F]
        causal = cols[None, :, None] >= cols[None, None, :]  # [1, F, F]
        own = (causal & ok[:, None, :] & ok[:, :, None]) | torch.eye(width, dtype=torch.bool, device=self.device)
        seen = torch.cat([self.valid[:, None, :] & ok[:, :, None], own], dim=2)  # [B, F, S + F]
        out = self.model(
            input_ids=ids,
            attention_mask=additive_mask(seen[:, None], self.dtype),
            position_ids=self.next_pos[:, None] + cols[None, :],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.valid = torch.cat([self.valid, ok], dim=1)
        self.next_pos = self.next_pos + ok.sum(1)
        logits: torch.Tensor = out.logits[torch.arange(len(feeds), device=self.device), lens - 1]
        return logits

    def write_back(self, drafters: Sequence[ModelDrafter]) -> None:
        for b, d in enumerate(drafters):
            slots = self.valid[b].nonzero().flatten()
            d.cache = DynamicCache()
            for layer, stacked in enumerate(self.cache.layers):
                keys, values = layer_kv(stacked)
                d.cache.update(keys[b : b + 1, :, slots], values[b : b + 1, :, slots], layer)
