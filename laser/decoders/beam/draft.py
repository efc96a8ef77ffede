"""Drafting beams with a small model (AtSpeed): the draft model's own constrained beam search of width
``N`` for ``gamma`` steps from the target's live beams, laid out with them as one tree.

:class:`TreeDraftModel` keeps the draft model's KV cache of the prompt and, during one proposal, of the
tree nodes fed so far: each forward feeds only new nodes, which attend to the prompt, their ancestors
and themselves (additive 4D mask, positions = prompt length + depth). Between proposals it keeps the
nodes the target keeps (the live beams' prefixes) and drops the rest.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import CacheLayerMixin

from laser.decoders.beam.search import BeamState, Hyp, Seq, beam_probs, beam_step, candidates
from laser.drafting import Drafter
from laser.tree import DraftTree, additive_mask


def head_rows(model: PreTrainedModel, vocab: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(token ids, their output-embedding rows) for a head restricted to ``vocab``; None: the full head
    (no vocabulary given, or a head that is not a plain linear layer)."""
    head = model.get_output_embeddings()
    if vocab is None or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    ids = torch.tensor(sorted(set(int(v) for v in vocab)), dtype=torch.long, device=head.weight.device)
    return ids, head.weight[ids].detach()


class TreeDraftModel:
    """A draft model's cache over a prompt, plus tree nodes fed in parent-first order.

    With ``vocab`` (the item trie's tokens) the head scores only those tokens: the draft's next-token
    distribution is normalised over the catalogue's vocabulary, which is all a constrained search reads,
    and the head's cost shrinks from the whole vocabulary to the catalogue's.
    """

    def __init__(self, model: PreTrainedModel, prompt_ids: Sequence[int], vocab: Sequence[int] | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.head = head_rows(model, vocab)
        self.cache = DynamicCache()
        self.prefix = len(prompt_ids) - 1  # the last prompt token is the tree's root
        if self.prefix:
            with torch.inference_mode():
                self._body(
                    input_ids=torch.tensor([list(prompt_ids[:-1])], device=self.device),
                    past_key_values=self.cache,
                    use_cache=True,
                )
        self.ancestors: list[np.ndarray] = []  # per node: indices of its ancestors and itself
        self.depth: list[int] = []

    @property
    def fed(self) -> int:
        return len(self.depth)

    def keep(self, nodes: Sequence[int]) -> None:
        """Keep only ``nodes`` (each after its parent; the prompt stays), renumbered 0, 1, ..."""
        where = {old: new for new, old in enumerate(nodes)}
        self.ancestors = [np.array([where[a] for a in self.ancestors[old]], dtype=np.int64) for old in nodes]
        self.depth = [self.depth[old] for old in nodes]
        index = torch.tensor([self.prefix + n for n in nodes], dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if (
                not isinstance(layer, CacheLayerMixin)
                or layer.keys is None
                or layer.values is None
                or layer.keys.numel() == 0
            ):
                continue
            layer.keys = torch.cat([layer.keys[:, :, : self.prefix], layer.keys[:, :, index]], 2)
            layer.values = torch.cat([layer.values[:, :, : self.prefix], layer.values[:, :, index]], 2)

    def reset(self) -> None:
        """Drop the tree nodes (keep the prompt)."""
        self.keep([])

    def sync(
        self, kept_from: list[int], tokens: list[int], parents: list[int], nodes: dict[Seq, int]
    ) -> dict[Seq, torch.Tensor]:
        """Match the draft's cache to a new tree whose first nodes are the previous tree's ``kept_from``
        (sorted): keep those it has fed (a prefix of them), feed the rest of the tree; the draft's rows of
        the fed sequences (``nodes``: sequence -> node)."""
        have = sum(1 for i in kept_from if i < self.fed)
        self.keep(kept_from[:have])
        lp = self.feed(tokens[have:], parents[have:])
        return {seq: lp[i - have] for seq, i in nodes.items() if i >= have}

    @torch.inference_mode()
    def feed(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append nodes (``parents`` index earlier nodes, -1 = none) and return their ``[m, V]`` log-probs."""
        start, m = len(self.depth), len(tokens)
        for p in parents:
            anc = self.ancestors[p] if p >= 0 else np.empty(0, dtype=np.int64)
            self.ancestors.append(np.append(anc, len(self.ancestors)))
            self.depth.append(self.depth[p] + 1 if p >= 0 else 0)
        total = start + m
        seen = np.zeros((m, self.prefix + total), dtype=bool)
        seen[:, : self.prefix] = True
        for i in range(m):
            seen[i, self.prefix + self.ancestors[start + i]] = True
        mask = additive_mask(torch.from_numpy(seen).to(self.device)[None, None], self.dtype)
        pos = torch.tensor([[self.prefix + d for d in self.depth[start:]]], device=self.device)
        hidden = self._body(
            input_ids=torch.tensor([list(tokens)], device=self.device),
            attention_mask=mask,
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
        )[0]
        if self.head is None:
            return torch.log_softmax(self.model.get_output_embeddings()(hidden).float(), dim=-1)
        vocab, weight = self.head
        out = torch.full((m, self.model.config.vocab_size), float("-inf"), device=self.device)
        out[:, vocab] = torch.log_softmax((hidden @ weight.T).float(), dim=-1)
        return out

    def _body(self, **kwargs: Any) -> torch.Tensor:
        """The model without its head: last hidden states ``[1, n, H]``."""
        hidden: torch.Tensor = self.model.base_model(**kwargs).last_hidden_state
        return hidden


class BeamTreeDrafter(Drafter):
    """Live target beams + the draft model's beams of ``gamma`` more steps (width ``width``), as one tree.

    Strict mode drafts the draft model's deterministic top-``width`` beams (the same constrained beam step
    as the target's, on draft log-probabilities, starting from the target's beams and scores). The draft
    keeps its cache of the tree nodes the target keeps, so each proposal feeds it only new nodes.
    """

    def __init__(
        self, state: BeamState, draft: TreeDraftModel, gamma: int, width: int, sampled: bool = False, seed: int = 0
    ):
        if gamma < 0 or width < 1:
            raise ValueError(f"gamma must be >= 0 and N >= 1, got gamma={gamma}, N={width}")
        self.state, self.draft, self.gamma, self.width = state, draft, gamma, width
        self.sampled = sampled  # relaxed mode: sampled steps, recorded in ``state.drafted`` for the verifier
        self.generator = torch.Generator().manual_seed(seed + 1)

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        st = self.state
        kept_from = st.tree.kept_from  # the kept nodes' places in the previous tree
        tokens, parents = st.lay_out(context[-1])
        if self.gamma and st.live:
            rows = self.draft.sync(kept_from, tokens, parents, st.tree.nodes)
            if self.sampled:
                self._draft_sampled(tokens, parents, rows)
            else:
                self._draft(tokens, parents, rows)
        return DraftTree(np.array(tokens), np.array(parents), cached=st.tree.cached)

    def _draft(self, tokens: list[int], parents: list[int], rows: dict[Seq, torch.Tensor]) -> None:
        """Extend ``tokens/parents`` in place with the draft's beams of each of ``gamma`` steps."""
        hyps = self.state.live
        for j in range(self.gamma):
            hyps = beam_step(hyps, rows, self.state.trie, self.width)
            new = [h.seq for h in hyps if not h.done and self.state.tree.row(h.seq) is None]
            if not new:
                return
            self._add_nodes(new, tokens, parents, rows, feed=j + 1 < self.gamma)
            hyps = [h for h in hyps if not h.done]

    def _draft_sampled(self, tokens: list[int], parents: list[int], rows: dict[Seq, torch.Tensor]) -> None:
        """Relaxed mode: ``width`` distinct beams sampled per step from the draft's beam-level distribution
        q (from all target beams, finished ones included); records each step's draws and q."""
        from laser.decoders.beam.relaxed import sample_distinct

        hyps = list(self.state.hyps)
        steps: list[tuple[list[Seq], dict[Seq, float]]] = []
        self.state.drafted = steps
        for j in range(self.gamma):
            seqs, scores = candidates(hyps, rows, self.state.trie)
            q = beam_probs(scores)
            chosen = sample_distinct(q, self.width, self.generator)
            steps.append(([seqs[i] for i in chosen], dict(zip(seqs, q.tolist()))))
            hyps = [Hyp(seqs[i], float(scores[i]), self.state.trie.item(seqs[i]) is not None) for i in chosen]
            new = [h.seq for h in hyps if not h.done and self.state.tree.row(h.seq) is None]
            if not new:
                return
            self._add_nodes(new, tokens, parents, rows, feed=j + 1 < self.gamma)

    def _add_nodes(
        self, new: list[Seq], tokens: list[int], parents: list[int], rows: dict[Seq, torch.Tensor], feed: bool
    ) -> None:
        """Append the new beam ends as tree nodes; with ``feed``, run the draft on them for their next rows
        (the last step's beams need none: the next proposal feeds the ones the target keeps)."""
        first = len(tokens)
        for seq in new:
            self.state.tree.add(seq, tokens, parents)
        if feed:
            lp = self.draft.feed(tokens[first:], parents[first:])
            rows.update({seq: lp[i] for i, seq in enumerate(new)})

    def close(self) -> None:
        self.draft.cache = DynamicCache()
