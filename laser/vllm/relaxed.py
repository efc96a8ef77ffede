"""LASER's relaxed verification as a rejection rule inside vLLM.

vLLM verifies a request's draft chain in its ``RejectionSampler``: greedy requests accept a draft token
iff it is the target's argmax (lossless), sampled ones run standard speculative sampling. LASER's
relaxed rule (paper Eq. 8) accepts a draft token x at position j iff

    x == argmax p_j   or   (x in TopK(p_j, k)  and  p_j(x) > p)

where p_j is the target distribution after the accepted prefix. The first rejected position emits the
target's argmax there (the *recovered* token); a fully accepted chain gets the argmax after it (the
*bonus* token). The rule is deterministic: requests that ask for it run at temperature 0.

:class:`RelaxedRejectionSampler` wraps vLLM's own sampler: it runs vLLM's sampler for the whole
batch (so greedy and sampled requests stay vLLM's own), then rewrites the rows of requests that asked
for the relaxed rule. Nothing of vLLM is forked or patched; the model runner's ``rejection_sampler``
attribute is replaced by this wrapper (see :mod:`laser.vllm.proposer`).

Worked example (k=2, p=0.1): target probabilities at the three draft positions
``[{7: .6, 3: .3}, {5: .5, 9: .45}, {2: .9}]``, draft ``[3, 9, 4]``: 3 is in the top-2 with .3 > .1
(accepted), 9 in the top-2 with .45 (accepted), 4 not in the top-2 (rejected, recovered = 2). Output
``[3, 9, 2]``; greedy verification would have given ``[7]``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: "no token here"


def relaxed_accept(logits: torch.Tensor, draft: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Which draft tokens the relaxed rule accepts, each judged on its own position.

    Args:
        logits: ``[N, V]`` target logits at the N draft positions (the row that predicts the draft).
        draft: ``[N]`` draft token ids.
        k: ``[N]`` top-k of each position's request (k=1 is greedy).
        p: ``[N]`` probability threshold of each position's request.
    Returns:
        ``[N]`` bool.
    """
    logits = logits.float()
    draft_logit = logits.gather(1, draft[:, None].long())[:, 0]  # [N]
    ok = draft == logits.argmax(-1)
    kmax = int(k.max()) if k.numel() else 1
    if kmax > 1:
        top = logits.topk(kmax, dim=-1).values  # [N, kmax]
        kth = top.gather(1, (k.long() - 1).clamp(min=0)[:, None])[:, 0]  # [N] each row's k-th value
        prob = (draft_logit - torch.logsumexp(logits, dim=-1)).exp()
        ok |= (k > 1) & (draft_logit >= kth) & (prob > p)
    return ok


def chain_output(accept: torch.Tensor, draft: torch.Tensor, argmax: torch.Tensor, bonus: torch.Tensor,
                 num_draft: Sequence[int], width: int) -> torch.Tensor:
    """Output tokens per row: accepted drafts, then the argmax at the first rejection, or the bonus.

    Args:
        accept: ``[N]`` bool per draft token (rows' drafts concatenated).
        draft: ``[N]`` draft tokens.
        argmax: ``[N]`` the target's argmax at each draft position.
        bonus: ``[B]`` the token after a fully accepted chain.
        num_draft: drafts per row (sum N).
        width: columns of the output (vLLM's ``max_spec_len + 1``).
    Returns:
        ``[B, width]`` token ids, ``PLACEHOLDER`` after each row's last token.
    """
    out = torch.full((len(num_draft), width), PLACEHOLDER, dtype=torch.int32)
    start = 0
    acc, dr, am = accept.tolist(), draft.tolist(), argmax.tolist()
    for i, n in enumerate(num_draft):
        a = 0
        while a < n and acc[start + a]:
            a += 1
        out[i, :a] = torch.tensor(dr[start:start + a], dtype=torch.int32)
        out[i, a] = am[start + a] if a < n else int(bonus[i])
        start += n
    return out


class RelaxedRejectionSampler(torch.nn.Module):
    """vLLM's rejection sampler, with the relaxed rule for the rows that ask for it.

    Args:
        inner: vLLM's ``RejectionSampler`` of the model runner.
        rules: returns, for the batch being verified, one ``(k, p)`` per row, or None for rows that
            keep vLLM's own rule.
    """

    def __init__(self, inner: torch.nn.Module, rules: Callable[[], list[tuple[int, float] | None]]):
        super().__init__()
        self.inner = inner
        self.rules = rules
        self.relaxed_rows = 0  # rows verified with the relaxed rule, for tests and reports

    def __getattr__(self, name):  # anything else vLLM reads from its sampler
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        rules = self.rules()
        relaxed = [i for i, r in enumerate(rules) if r is not None]
        if relaxed and metadata.draft_token_ids.numel():
            # read the raw logits before vLLM's sampler may modify them in place
            num_draft = list(metadata.num_draft_tokens)
            target = logits[metadata.target_logits_indices]  # [N, V]
            bonus = logits[metadata.bonus_logits_indices].argmax(-1).cpu()  # [B]
            row_of = torch.repeat_interleave(torch.arange(len(num_draft)), torch.tensor(num_draft))
            k = torch.tensor([(rules[i] or (1, 0.0))[0] for i in range(len(num_draft))])[row_of]
            p = torch.tensor([(rules[i] or (1, 0.0))[1] for i in range(len(num_draft))])[row_of]
            draft = metadata.draft_token_ids.cpu()
            accept = relaxed_accept(target.cpu(), draft, k, p)
            mine = chain_output(accept, draft, target.argmax(-1).cpu(), bonus, num_draft,
                                metadata.max_spec_len + 1)
        out = self.inner(metadata, draft_probs, logits, sampling_metadata)
        if relaxed and metadata.draft_token_ids.numel():
            ids = out.sampled_token_ids
            rows = torch.tensor(relaxed)
            ids[rows.to(ids.device)] = mine[rows].to(ids.device, ids.dtype)
            self.relaxed_rows += len(relaxed)
        return out
