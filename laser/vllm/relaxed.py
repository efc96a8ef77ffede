"""LASER's relaxed verification as a rejection rule inside vLLM.

vLLM verifies a request's draft chain in its ``RejectionSampler``: greedy requests accept a draft token
iff it is the target's argmax (lossless), sampled ones run standard speculative sampling. LASER's
relaxed rule (paper Eq. 8) accepts a draft token x at position j iff

    x == argmax p_j   or   (x in TopK(p_j, k)  and  p_j(x) > p)

where p_j is the target distribution after the accepted prefix. The first rejected position emits the
target's argmax there (the *recovered* token); a fully accepted chain gets the argmax after it (the
*bonus* token). The rule is deterministic: requests that ask for it run at temperature 0. As on this
package's engine (:class:`laser.verify.TopKVerifier`), a draft token that would complete a token n-gram
the request's generated text already holds is judged by the greedy rule alone: the proposer marks those
positions (``stale``) when it drafts them, so relaxed acceptance never feeds a loop.

Where it acts: :class:`RelaxedRule` is a mixin over vLLM's own ``RejectionSampler`` class (the plug-in,
:mod:`laser.vllm.plugin`, builds the runner's sampler as ``LaserRejectionSampler(RelaxedRule,
RejectionSampler)`` with vLLM's arguments). It overrides one step, ``apply_logits_processors``: vLLM
applies penalties, allowed tokens, min_tokens and the thinking budget to the target logits of the draft
positions (bad words: from the plug-in's index, :mod:`laser.vllm.bad_words`), then the rule judges the relaxed rows' drafts on those *processed* logits, on
their device, in one batched computation, and makes each accepted draft token the argmax of its
position (its logit is raised just above the row's maximum; nothing else changes). vLLM's own greedy
kernel then emits exactly the relaxed chain: the accepted drafts, then at the first rejection the
processed argmax, or after a fully accepted chain vLLM's bonus token (sampled from the processed bonus
logits). Greedy and sampled rows are untouched. A request asking for processed logprobs together with
the relaxed rule is refused (the raised logits would show in them).

Worked example (k=2, p=0.1): target probabilities at the three draft positions
``[{7: .6, 3: .3}, {5: .5, 9: .45}, {2: .9}]``, draft ``[3, 9, 4]``: 3 is in the top-2 with .3 > .1
(accepted), 9 in the top-2 with .45 (accepted), 4 not in the top-2 (rejected, recovered = 2). Output
``[3, 9, 2]``; greedy verification would have given ``[7]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from laser.vllm.bad_words import ban_drafts, take_words

if TYPE_CHECKING:
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: "no token here"

Rule = tuple[int, float] | tuple[int, float, Sequence[bool]]  # (k, p[, stale draft positions])
Rules = Callable[[], "list[Rule | None] | None"]


def relaxed_accept(
    logits: torch.Tensor, draft: torch.Tensor, k: torch.Tensor, p: torch.Tensor, kmax: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which draft tokens the relaxed rule accepts, each judged on its own position.

    One top-k pass over the vocabulary judges every position; the softmax normaliser is computed only at
    the positions whose draft is in the top-k but not the argmax (the only ones where the threshold
    decides), and ``argmax`` only where the maximum is tied (it is the first tied index, as vLLM's).

    Args:
        logits: ``[N, V]`` target logits at the N draft positions (the row that predicts the draft).
        draft: ``[N]`` draft token ids.
        k: ``[N]`` top-k of each position's request (k=1 is greedy).
        p: ``[N]`` probability threshold of each position's request.
        kmax: ``k.max()`` when the caller knows it (saves a device sync).
    Returns:
        ``([N] bool accepted, [N] each position's maximum logit)``, on the logits' device.
    """
    draft = draft.long()
    if kmax is None:
        kmax = int(k.max()) if k.numel() else 1
    width = min(max(kmax, 2), logits.shape[-1])
    top = logits.topk(width, dim=-1).values  # [N, width], best first
    draft_logit = logits.gather(1, draft[:, None])[:, 0]  # [N]
    ok = draft_logit >= top[:, 0]  # the draft attains the maximum ...
    if width > 1:
        tied = (ok & (top[:, 1] >= top[:, 0])).nonzero()[:, 0]
        if tied.numel():  # ... and is the argmax only if it is the first of the tied tokens
            ok[tied] = logits.index_select(0, tied).argmax(-1) == draft[tied]
    if kmax > 1:
        kth = top.gather(1, (k.long() - 1).clamp(min=0, max=width - 1)[:, None])[:, 0]  # each row's k-th value
        near = ((k > 1) & ~ok & (draft_logit >= kth)).nonzero()[:, 0]
        if near.numel():  # in the top-k, not the argmax: the probability threshold decides
            lse = torch.logsumexp(logits.index_select(0, near).float(), dim=-1)
            prob = (draft_logit[near].float() - lse).exp()
            ok[near] = prob > p[near].to(prob.dtype)
    return ok, top[:, 0]


def chain_output(
    accept: torch.Tensor,
    draft: torch.Tensor,
    argmax: torch.Tensor,
    bonus: torch.Tensor,
    num_draft: Sequence[int],
    width: int,
) -> torch.Tensor:
    """Output tokens per row: accepted drafts, then the argmax at the first rejection, or the bonus.

    (What vLLM's greedy kernel emits once :class:`RelaxedRule` made the accepted drafts the argmax; the
    reference form of the rule, batched without a loop over rows.)

    Args:
        accept: ``[N]`` bool per draft token (rows' drafts concatenated).
        draft: ``[N]`` draft tokens.
        argmax: ``[N]`` the target's argmax at each draft position.
        bonus: ``[B]`` the token after a fully accepted chain.
        num_draft: drafts per row (sum N).
        width: columns of the output (vLLM's ``max_spec_len + 1``).
    Returns:
        ``[B, width]`` int32 token ids, ``PLACEHOLDER`` after each row's last token.
    """
    device = draft.device
    B = len(num_draft)
    n = torch.as_tensor(list(num_draft), dtype=torch.long, device=device)  # [B]
    start = torch.cumsum(n, 0) - n  # [B]
    col = torch.arange(max(width - 1, 1), device=device)  # [W-1]
    valid = col[None, :] < n[:, None]  # [B, W-1]
    flat = (start[:, None] + col[None, :]).clamp(max=max(draft.numel() - 1, 0))  # [B, W-1]
    acc = accept.bool()[flat] & valid if draft.numel() else valid
    n_acc = torch.cumprod(acc.int(), dim=1).sum(1)  # [B] accepted prefix length
    drafts = draft.long()[flat] if draft.numel() else torch.zeros_like(flat)
    out = torch.full((B, width), PLACEHOLDER, dtype=torch.int32, device=device)
    keep = col[None, :] < n_acc[:, None]
    out[:, : width - 1] = torch.where(keep, drafts, torch.full_like(drafts, PLACEHOLDER)).to(torch.int32)
    at = (start + n_acc).clamp(max=max(argmax.numel() - 1, 0))
    recovered = argmax.long()[at] if argmax.numel() else torch.zeros_like(n_acc)
    nxt = torch.where(n_acc < n, recovered, bonus.reshape(-1).long().to(device))
    out.scatter_(1, n_acc[:, None], nxt[:, None].to(torch.int32))
    return out


class RelaxedRule:
    """Mixin over vLLM's ``RejectionSampler``: the relaxed rule for the rows that ask for it, on the
    processed logits (see the module docstring). Built by :func:`build_sampler`.

    ``laser_rules()`` returns None when no request of the batch asked for the rule, else one ``(k, p)``
    or None per row of the batch (in the input batch's order, as vLLM's ``num_draft_tokens``).
    """

    laser_rules: Rules
    relaxed_rows: int
    relaxed_positions: int

    def apply_logits_processors(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, metadata: SpecDecodeMetadata
    ) -> torch.Tensor:
        meta, indexes = take_words(sampling_metadata)  # bad words from the index (laser/vllm/bad_words.py)
        logits = super().apply_logits_processors(logits, meta, metadata)  # type: ignore[misc]
        if indexes:
            ban_drafts(logits, indexes, meta.output_token_ids, meta.spec_token_ids, metadata.num_draft_tokens)
        rules = self.laser_rules()
        if rules is not None and logits.shape[0]:
            self._relax(logits, sampling_metadata, metadata, rules)
        return logits

    def _relax(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        metadata: SpecDecodeMetadata,
        rules: Sequence[Rule | None],
    ) -> None:
        counts = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
        if len(rules) != len(counts):
            raise RuntimeError(
                f"laser relaxed rule: {len(rules)} rules for a batch of {len(counts)} rows "
                "(the proposer's batch and the sampler's are out of step)"
            )
        k_row = np.array([r[0] if r is not None else 0 for r in rules], dtype=np.int64)
        if not (k_row > 0).any():
            return
        p_row = np.array([r[1] if r is not None else 0.0 for r in rules], dtype=np.float32)
        k_tok, p_tok = np.repeat(k_row, counts), np.repeat(p_row, counts)
        k_tok[_stale_positions(rules, counts)] = 0  # only the greedy rule may accept them
        pos = np.nonzero(k_tok > 0)[0]
        if not len(pos):
            return
        if getattr(self, "is_processed_logprobs_mode", False) and sampling_metadata.max_num_logprobs is not None:
            raise ValueError(
                "relaxed verification cannot return processed logprobs (logprobs_mode "
                "processed_*): ask for raw logprobs or greedy verification"
            )
        dev = logits.device
        idx = torch.from_numpy(pos).to(dev, non_blocking=True)
        if len(pos) == logits.shape[0]:  # every position is relaxed: no copy
            sub, draft = logits, metadata.draft_token_ids.long()
        else:  # [M, V] processed logits of the relaxed draft positions
            sub, draft = logits.index_select(0, idx), metadata.draft_token_ids.index_select(0, idx).long()
        acc, top = relaxed_accept(
            sub,
            draft,
            torch.from_numpy(k_tok[pos]).to(dev),
            torch.from_numpy(p_tok[pos]).to(dev),
            kmax=int(k_tok[pos].max()),
        )
        cur = sub.gather(1, draft[:, None])[:, 0]
        raised = top + top.abs().clamp(min=1.0) * 1e-2  # strictly the row's maximum, in any float precision
        logits.index_put_((idx, draft), torch.where(acc, raised.to(logits.dtype), cur.to(logits.dtype)))
        self.relaxed_rows += int(((k_row > 0) & (counts > 0)).sum())
        self.relaxed_positions += len(pos)


_SAMPLER_CLASS: type[RejectionSampler] | None = None


def _stale_positions(rules: Sequence[Rule | None], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Per draft position of the batch: whether its row's rule marks it stale (it would complete a repeated
    n-gram of the row's own text: :func:`laser.verify.repeats`); a row's marks beyond its drafts are ignored."""
    out = np.zeros(int(counts.sum()), dtype=bool)
    start = 0
    for rule, count in zip(rules, counts.tolist()):
        if rule is not None and len(rule) > 2:
            marks = list(rule[2])[:count]
            out[start : start + len(marks)] = marks
        start += count
    return out


def build_sampler(runner: Any, rules: Rules) -> RejectionSampler:
    """vLLM's rejection sampler for ``runner`` (built as vLLM builds it) with :class:`RelaxedRule` mixed in."""
    global _SAMPLER_CLASS
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    if _SAMPLER_CLASS is None:
        _SAMPLER_CLASS = type("LaserRejectionSampler", (RelaxedRule, RejectionSampler), {})
    sampler: Any = _SAMPLER_CLASS(runner.sampler, runner.speculative_config, runner.device)
    sampler.laser_rules = rules
    sampler.relaxed_rows = 0
    sampler.relaxed_positions = 0
    return sampler  # type: ignore[no-any-return]
