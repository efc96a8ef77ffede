"""Drafting beams with a small model (AtSpeed): the draft model's own constrained beam search of width
``N`` for ``gamma`` steps from the target's live beams, laid out with them as one tree.

:class:`TreeDraftModel` keeps the draft model's KV cache of the prompt and, during one proposal, of the
tree nodes fed so far: each forward feeds only new nodes, which attend to the prompt, their ancestors
and themselves (additive 4D mask, positions = prompt length + depth). The tree part is cut after each
proposal (the next one starts from new beams).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from laser.beam import BeamState, Hyp, Seq, beam_probs, beam_step, candidates, layout
from laser.drafting import Drafter
from laser.tree import DraftTree, additive_mask


class TreeDraftModel:
    """A draft model's cache over a prompt, plus tree nodes fed in parent-first order."""

    def __init__(self, model: torch.nn.Module, prompt_ids: Sequence[int]):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache()
        self.prefix = len(prompt_ids) - 1  # the last prompt token is the tree's root
        if self.prefix:
            with torch.inference_mode():
                model(input_ids=torch.tensor([list(prompt_ids[:-1])], device=self.device), past_key_values=self.cache,
                      use_cache=True)
        self.reset()

    def reset(self) -> None:
        """Drop the tree nodes (keep the prompt)."""
        extra = self.cache.get_seq_length() - self.prefix
        if extra > 0:
            self.cache.crop(-extra)
        self.ancestors: list[np.ndarray] = []  # per node: indices of its ancestors and itself
        self.depth: list[int] = []

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
        out = self.model(input_ids=torch.tensor([list(tokens)], device=self.device), attention_mask=mask,
                         position_ids=pos, past_key_values=self.cache, use_cache=True)
        return torch.log_softmax(out.logits[0].float(), dim=-1)


class BeamTreeDrafter(Drafter):
    """Live target beams + the draft model's beams of ``gamma`` more steps (width ``width``), as one tree.

    Strict mode drafts the draft model's deterministic top-``width`` beams (the same constrained beam step
    as the target's, on draft log-probabilities, starting from the target's beams and scores).
    """

    def __init__(self, state: BeamState, draft: TreeDraftModel, gamma: int, width: int,
                 sampled: dict | None = None, seed: int = 0):
        if gamma < 0 or width < 1:
            raise ValueError(f"gamma must be >= 0 and N >= 1, got gamma={gamma}, N={width}")
        self.state, self.draft, self.gamma, self.width = state, draft, gamma, width
        self.sampled = sampled  # relaxed mode: the request's state, where the drafted steps are recorded
        self.generator = torch.Generator().manual_seed(seed + 1)

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        live = self.state.live
        tokens, parents, nodes = layout(context[-1], [h.seq for h in live])
        if self.gamma and live:
            if self.sampled is not None:
                self._draft_sampled(tokens, parents, nodes)
            else:
                self._draft(live, tokens, parents, nodes)
        self.state.nodes = nodes
        return DraftTree(np.array(tokens), np.array(parents))

    def _draft(self, live: list[Hyp], tokens: list[int], parents: list[int], nodes: dict[Seq, int]) -> None:
        """Extend ``tokens/parents/nodes`` in place with the draft's beams of each of ``gamma`` steps."""
        self.draft.reset()
        lp = self.draft.feed(tokens, parents)
        rows: dict[Seq, torch.Tensor] = {seq: lp[i] for seq, i in nodes.items()}
        hyps = list(live)
        for j in range(self.gamma):
            hyps = beam_step(hyps, rows, self.state.trie, self.width)
            new = [h.seq for h in hyps if not h.done and h.seq not in nodes]
            if not new:
                return
            self._add_nodes(new, tokens, parents, nodes, rows, feed=j + 1 < self.gamma)
            hyps = [h for h in hyps if not h.done]

    def _draft_sampled(self, tokens: list[int], parents: list[int], nodes: dict[Seq, int]) -> None:
        """Relaxed mode: ``width`` distinct beams sampled per step from the draft's beam-level distribution
        q (from all target beams, finished ones included); records each step's draws and q."""
        from laser.beam_relaxed import sample_distinct

        self.draft.reset()
        lp = self.draft.feed(tokens, parents)
        rows: dict[Seq, torch.Tensor] = {seq: lp[i] for seq, i in nodes.items()}
        hyps, steps = list(self.state.hyps), []
        self.sampled["drafted"] = steps
        for j in range(self.gamma):
            seqs, scores = candidates(hyps, rows, self.state.trie)
            q = beam_probs(scores)
            chosen = sample_distinct(q, self.width, self.generator)
            steps.append(([seqs[i] for i in chosen], dict(zip(seqs, q.tolist()))))
            hyps = [Hyp(seqs[i], float(scores[i]), self.state.trie.item(seqs[i]) is not None) for i in chosen]
            new = [h.seq for h in hyps if not h.done and h.seq not in nodes]
            if not new:
                return
            self._add_nodes(new, tokens, parents, nodes, rows, feed=j + 1 < self.gamma)

    def _add_nodes(self, new: list[Seq], tokens: list[int], parents: list[int], nodes: dict[Seq, int],
                   rows: dict[Seq, torch.Tensor], feed: bool) -> None:
        """Append the new beam ends as tree nodes; with ``feed``, run the draft on them for their next rows
        (the last step's beams need none)."""
        first = len(tokens)
        for seq in new:
            nodes[seq] = len(tokens)
            tokens.append(seq[-1])
            parents.append(nodes[seq[:-1]])
        if feed:
            lp = self.draft.feed(tokens[first:], parents[first:])
            rows.update({seq: lp[i] for i, seq in enumerate(new)})

    def close(self) -> None:
        self.draft.cache = DynamicCache()
