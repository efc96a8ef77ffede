"""A transformers ``Cache`` whose layers write into preallocated buffers, so that speculative steps can
keep or drop tree entries in place.

Slots ``[0, used)`` are shared by the whole batch; sequence b's valid entries are slots
``[0, cache_len[b])`` (the rest is padding or rejected draft, hidden by the attention mask). After a
verification step the accepted path's slots are copied down to ``cache_len[b]`` onwards and ``used``
shrinks to the longest sequence: when a path is already in place (a depth-first prefix laid out right
after the prefix) nothing is copied, the cache is only truncated.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _BufferLayer(DynamicLayer):
    """One layer's keys/values in a growable buffer ``[B, H, capacity, D]``; ``keys``/``values`` are views."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[-1])
        self._v = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[-1])
        self.used = 0
        self.is_initialized = True
        self._publish()

    def _publish(self) -> None:
        self.keys, self.values = self._k[:, :, : self.used], self._v[:, :, : self.used]

    def _reserve(self, slots: int) -> None:
        if slots <= self._k.shape[2]:
            return
        grow = lambda buf: torch.cat([buf, buf.new_empty(*buf.shape[:2], max(slots, 2 * buf.shape[2]) - buf.shape[2], buf.shape[3])], 2)  # noqa: E731
        self._k, self._v = grow(self._k), grow(self._v)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.used, key_states.shape[2]
        self._reserve(start + n)
        self._k[:, :, start:start + n] = key_states
        self._v[:, :, start:start + n] = value_states
        self.used = start + n
        self._publish()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.used if self.is_initialized else 0

    def keep(self, batch_idx: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, used: int) -> None:
        """Copy slots ``src`` to ``dst`` for rows ``batch_idx`` (all [M]), then keep ``used`` slots."""
        if len(src):
            self._k[batch_idx, :, dst] = self._k[batch_idx, :, src]
            self._v[batch_idx, :, dst] = self._v[batch_idx, :, src]
        self.used = used
        self._publish()

    def select_rows(self, rows: torch.Tensor) -> None:
        self._k, self._v = self._k[rows], self._v[rows]
        self._publish()


class TreeKVCache(Cache):
    """KV cache for tree-attention decoding of a batch; pass it as ``past_key_values``."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=_BufferLayer)

    @property
    def used(self) -> int:
        return self.get_seq_length()

    def keep_paths(self, starts: list[int], paths: list[list[int]], tree_offset: int) -> None:
        """For each sequence b, move tree slots ``tree_offset + paths[b]`` to ``starts[b]`` onwards."""
        b_idx, src, dst = [], [], []
        for row, (start, path) in enumerate(zip(starts, paths)):
            for j, node in enumerate(path):
                if tree_offset + node != start + j:
                    b_idx.append(row), src.append(tree_offset + node), dst.append(start + j)
        used = max(start + len(path) for start, path in zip(starts, paths))
        device = self.layers[0].device
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        b_idx, src, dst = as_t(b_idx), as_t(src), as_t(dst)
        for layer in self.layers:
            layer.keep(b_idx, src, dst, used)

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows (finished sequences leave the batch)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.layers[0].device)
        for layer in self.layers:
            layer.select_rows(index)
