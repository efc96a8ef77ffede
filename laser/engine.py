"""The decoding loop shared by every tree/chain decoder: prefill, then propose -> one target forward under
tree attention -> verify -> keep the accepted KV -> commit, for a batch of sequences at once.

Per-sequence state (tokens, drafter, cache length, stats) lives in :class:`Request`; the model call
and the verification act on the whole padded batch. Sequences leave the batch when they finish.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from laser.drafting import Drafter
from laser.kv_cache import TreeKVCache
from laser.tree import pack_trees
from laser.verify import TopKVerifier, select_paths


@dataclass
class DecodeStats:
    """Counters of one generation. Times are wall seconds; in a batch, shared steps count for each member."""

    target_forwards: int = 0  # decoding forwards of the target, prefill excluded
    accepted_per_step: list[int] = field(default_factory=list)  # draft tokens accepted per forward
    new_tokens: int = 0
    finish_reason: str = ""  # "eos" | "length"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    retrieval_s: float = 0.0  # drafting: subtree retrieval + temporary-branch upkeep
    tree_s: float = 0.0  # laying out trees, masks and positions
    forward_s: float = 0.0
    verify_s: float = 0.0
    cache_s: float = 0.0  # KV compaction

    @property
    def aal(self) -> float:
        """Average acceptance length: tokens per target forward, (accepted + 1) averaged over steps."""
        steps = len(self.accepted_per_step)
        return (sum(self.accepted_per_step) + steps) / steps if steps else 0.0


@dataclass
class Request:
    tokens: list[int]  # prompt + generated; the last one is the next root (not yet cached)
    prompt_len: int
    drafter: Drafter
    max_new_tokens: int
    cache_len: int = 0
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len:]


class _Clock:
    """Adds elapsed wall time to a stats field of every active sequence (device synchronised)."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(self, seqs: list[Request], field_name: str, fn: Callable):
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        dt = time.perf_counter() - t0
        for s in seqs:
            setattr(s.stats, field_name, getattr(s.stats, field_name) + dt)
        return out


class TreeDecodingEngine:
    """Runs a batch of requests through tree-attention speculative decoding with a given verifier."""

    def __init__(self, model: torch.nn.Module, verifier: TopKVerifier, eos_ids: set[int]):
        self.model = model
        self.verifier = verifier
        self.eos_ids = eos_ids
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.clock = _Clock(self.device)

    @torch.inference_mode()
    def run(self, seqs: list[Request]) -> list[Request]:
        cache = TreeKVCache()
        self.clock.timed(seqs, "prefill_s", lambda: self._prefill(seqs, cache))
        active = list(seqs)
        while active:
            finished = self._step(active, cache)
            if finished:
                keep = [i for i, s in enumerate(active) if s not in finished]
                if keep:
                    self.clock.timed(active, "cache_s", lambda: cache.select_rows(keep))
                active = [active[i] for i in keep]
        for s in seqs:
            s.drafter.close()
            s.stats.new_tokens = len(s.new_tokens)
        return seqs

    def _prefill(self, seqs: list[Request], cache: TreeKVCache) -> None:
        """Cache every prompt token but the last, which becomes the first step's root.

        Prompts are right-padded and run causally without an explicit mask (SDPA's fast causal path):
        a valid token never sees a later pad, and pad slots stay hidden afterwards (``cache_len``).
        """
        lens = [len(s.tokens) - 1 for s in seqs]
        width = max(lens)
        if width == 0:
            return
        ids = torch.tensor([s.tokens[:-1] + [0] * (width - n) for s, n in zip(seqs, lens)], device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        for s, n in zip(seqs, lens):
            s.cache_len = n

    def _step(self, seqs: list[Request], cache: TreeKVCache) -> list[Request]:
        """One speculative step for every active sequence; returns those that finished."""
        step_t0 = time.perf_counter()
        trees = self.clock.timed(seqs, "retrieval_s", lambda: [s.drafter.propose(s.tokens) for s in seqs])
        offset = cache.used
        batch = self.clock.timed(seqs, "tree_s", lambda: pack_trees(
            trees, [s.cache_len for s in seqs], offset, self.dtype, self.device))
        # One token per row over fully valid caches needs no mask (SDPA's fast path), as in plain decoding.
        plain = batch.input_ids.shape[1] == 1 and all(s.cache_len == offset for s in seqs)
        logits = self.clock.timed(seqs, "forward_s", lambda: self.model(
            input_ids=batch.input_ids, attention_mask=None if plain else batch.attention_mask,
            position_ids=batch.position_ids, past_key_values=cache, use_cache=True).logits)
        verdict = self.clock.timed(seqs, "verify_s", lambda: select_paths(
            logits, batch, self.verifier.accept_nodes(logits, batch)))
        self.clock.timed(seqs, "cache_s", lambda: cache.keep_paths([s.cache_len for s in seqs], verdict.path, offset))

        finished = []
        for s, tree, path, nxt in zip(seqs, trees, verdict.path, verdict.next_token):
            s.cache_len += len(path)
            s.stats.target_forwards += 1
            s.stats.accepted_per_step.append(len(path) - 1)
            new = self._clip(s, [int(t) for t in tree.tokens[path[1:]]] + [nxt])
            s.tokens.extend(new)
            if s.stats.finish_reason:
                finished.append(s)
            else:
                self.clock.timed([s], "retrieval_s", lambda: s.drafter.commit(new))
        for s in seqs:
            s.stats.decode_s += time.perf_counter() - step_t0
        return finished

    def _clip(self, s: Request, new: list[int]) -> list[int]:
        """Cut ``new`` at the first end-of-sequence token or the token budget, and record why."""
        room = s.max_new_tokens - len(s.new_tokens)
        new = new[:room]
        for i, tok in enumerate(new):
            if tok in self.eos_ids:
                s.stats.finish_reason = "eos"
                return new[: i + 1]
        if len(new) == room:
            s.stats.finish_reason = "length"
        return new
