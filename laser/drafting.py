"""Drafters: where draft trees come from. Each request gets its own drafter, which owns its state.

The engine calls, per step: ``propose(context, budget)`` -> a :class:`DraftTree` rooted at the last
token (an engine that verifies chains asks ``propose_chain`` for its first path); after verification
``commit(new_tokens, hidden)`` with the tokens appended (accepted drafts, then the correction/bonus);
``close()`` when the request ends. A drafter that sets ``needs_hidden`` gets the target's last hidden
state at the last accepted position (``[H]``); the others never cost the engine that read. Drafters of
one class may draft together (one draft-model forward for the batch) by overriding ``propose_batch``.

A *draft source* (e.g. a retrieval pool) opens one drafter per request.
"""

from __future__ import annotations

from typing import Protocol, Sequence, TypeVar

import torch

from laser.tree import DraftTree

D = TypeVar("D", bound="Drafter")


class Drafter:
    """Base class with the default (no-op) behaviour of every hook."""

    needs_hidden: bool = False  # a class default; a wrapping drafter sets it per instance

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        """A draft tree rooted at ``context[-1]`` (not yet in the KV cache) with at most ``budget`` drafts."""
        return DraftTree.chain(context[-1])

    def propose_chain(self, context: Sequence[int], budget: int | None = None) -> list[int]:
        """The draft tokens of :meth:`propose`'s first root-to-leaf path (for engines that verify chains);
        drafters that can find it without building the tree override this."""
        return self.propose(context, budget).first_path()

    @classmethod
    def propose_batch(
        cls: type[D], drafters: Sequence[D], contexts: Sequence[Sequence[int]], budgets: Sequence[int | None]
    ) -> list[DraftTree]:
        """Trees for several requests whose drafters are all of this class (override to batch)."""
        return [d.propose(c, b) for d, c, b in zip(drafters, contexts, budgets)]

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        """Tokens appended by the last step; ``hidden`` only for drafters that set ``needs_hidden``."""

    def match_length(self, context: Sequence[int]) -> int | None:
        """How many tokens at the end of ``context`` the drafter matched (0: it has nothing to draft), for
        budgets that weigh a draft by its match; None when the drafter has no such notion."""
        return None

    def close(self) -> None:
        """The request ended: drop its per-request state."""


class NoDrafter(Drafter):
    """Proposes the root alone: one token per step (autoregressive decoding on the same code path)."""


class DraftSource(Protocol):
    def open(self, prompt_ids: Sequence[int], max_nodes: int, n_max: int, min_prob: float) -> Drafter:
        """A drafter for one request whose prompt is ``prompt_ids``.

        Trees hold at most ``max_nodes`` drafts, found from prefixes of at most ``n_max`` tokens, each
        having followed its prefix in at least ``min_prob`` of the prefix's occurrences.
        """
