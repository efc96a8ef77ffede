"""The relaxed rule is written twice: for tree batches (``laser.verify.TopKVerifier``, this package's engine)
and for vLLM's chains (``laser.vllm.relaxed.relaxed_accept``). On the same logits (many ties: small integer
logits) and the same drafts, for greedy and relaxed settings, both must accept exactly the same tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from laser import TopKVerifier
from laser.vllm.relaxed import relaxed_accept


def _chain(n: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[n, vocab]`` with ties everywhere and ``n`` drafts, most of them among each row's best."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 4, (n, vocab), generator=g).float()
    ranked = logits.argsort(dim=-1, descending=True, stable=True)
    pick = torch.randint(0, 4, (n,), generator=g)  # mostly a top-4 token, sometimes any
    drafts = torch.where(
        torch.rand(n, generator=g) < 0.8, ranked[torch.arange(n), pick], torch.randint(0, vocab, (n,), generator=g)
    )
    return logits, drafts


def _tree_rule(verifier: TopKVerifier, logits: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The tree verifier on a chain: node j+1 (draft j) is judged at row j, its parent's."""
    n = drafts.shape[0]
    batch = SimpleNamespace(
        tokens=torch.cat([torch.tensor([0]), drafts])[None],
        parents=torch.arange(-1, n)[None],
        node_valid=torch.ones(1, n + 1, dtype=torch.bool),
    )
    tree_logits = torch.cat([logits, logits[-1:]])[None]  # the last node's row predicts nothing judged here
    return verifier.accept_nodes(tree_logits, batch)[0, 1:]


@pytest.mark.parametrize("k,p", [(1, 0.0), (2, 0.0), (2, 0.1), (3, 0.05), (4, 0.2), (8, 0.01)])
def test_tree_and_chain_relaxed_rules_accept_the_same_tokens(k, p):
    for seed in range(20):
        logits, drafts = _chain(64, 12, seed)
        chain, _ = relaxed_accept(logits, drafts, torch.full((64,), k), torch.full((64,), p))
        assert torch.equal(_tree_rule(TopKVerifier(k=k, p=p), logits, drafts), chain), (k, p, seed)


def test_the_comparison_tells_rules_apart():
    logits, drafts = _chain(64, 12, 0)
    chain, _ = relaxed_accept(logits, drafts, torch.full((64,), 3), torch.full((64,), 0.05))
    assert not torch.equal(_tree_rule(TopKVerifier(k=2, p=0.05), logits, drafts), chain)  # another k differs
    assert chain.any() and not chain.all()
