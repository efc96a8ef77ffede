"""A transformers ``Cache`` with a fixed number of request slots, each a preallocated row of KV buffers,
so that speculative steps keep or drop tree entries in place and requests come and go without
reallocating.

Each layer holds ``[slots, H, capacity, D]`` buffers. The active requests occupy rows ``[0, rows)``;
the model sees the views ``[:rows, :, :used]``. Slots ``[0, used)`` are shared by the active rows;
request b's valid entries are slots ``[0, cache_len[b])`` (the rest is padding or rejected draft, hidden
by the attention mask). After a verification step the accepted path's slots are copied down to
``cache_len[b]`` onwards and ``used`` shrinks to the longest request: when a path is already in place
(a depth-first prefix laid out right after the prefix) nothing is copied, the cache is only truncated.

A new request's prompt is prefilled in a separate forward (a plain ``DynamicCache``) and copied into a
free row (:meth:`SlotKVCache.write_rows`). A finished request's row is refilled, or the last active
row moves into it (:meth:`SlotKVCache.move_row`). Beam decoders keep several tree nodes after the prefix (their beams'
shared prefixes) in the same way (:meth:`SlotKVCache.keep_slots`). The buffers grow only when a request longer than the
capacity arrives (doubling), never per step.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _SlotLayer(DynamicLayer):
    """One layer's keys/values in ``[slots, H, capacity, D]`` buffers; ``keys``/``values`` are views."""

    def __init__(self, slots: int, capacity: int, rows: int = 0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # transformers leaves this __init__ unannotated
        self.slots, self.capacity, self.rows, self.used = slots, capacity, rows, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate every slot's buffers, shaped like ``key_states`` (heads, head dim, dtype, device)."""
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (self.slots, key_states.shape[1], self.capacity, key_states.shape[3])
        # zeros, not empty: a row's masked slots are still multiplied by 0 in attention, and 0 x NaN is NaN
        self._k, self._v = key_states.new_zeros(shape), key_states.new_zeros(shape)
        self.is_initialized = True
        self._publish()

    def _publish(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._k[: self.rows, :, : self.used], self._v[: self.rows, :, : self.used]
        self.keys, self.values = keys, values
        return keys, values

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` positions per row (doubling; existing entries kept)."""
        have = self._k.shape[2]
        if slots <= have:
            return

        def grow(buf: torch.Tensor) -> torch.Tensor:
            return torch.cat([buf, buf.new_zeros(*buf.shape[:2], max(slots, 2 * have) - have, buf.shape[3])], 2)

        self._k, self._v = grow(self._k), grow(self._v)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.used, key_states.shape[2]
        self.reserve(start + n)
        self._k[: self.rows, :, start : start + n] = key_states
        self._v[: self.rows, :, start : start + n] = value_states
        self.used = start + n
        return self._publish()

    def get_seq_length(self) -> int:
        return self.used if self.is_initialized else 0

    def keep(self, batch_idx: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, used: int) -> None:
        """Copy slots ``src`` to ``dst`` for rows ``batch_idx`` (all [M]), then keep ``used`` slots."""
        if len(src):
            self._k[batch_idx, :, dst] = self._k[batch_idx, :, src]
            self._v[batch_idx, :, dst] = self._v[batch_idx, :, src]
        self.used = used
        self._publish()

    def write_rows(self, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        width = keys.shape[2]
        self.reserve(width)
        self._k[rows, :, :width] = keys
        self._v[rows, :, :width] = values

    def move_row(self, src: int, dst: int, width: int) -> None:
        self._k[dst, :, :width] = self._k[src, :, :width]
        self._v[dst, :, :width] = self._v[src, :, :width]

    def set_rows(self, rows: int, used: int) -> None:
        self.rows, self.used = rows, used
        self._publish()


class SlotKVCache(Cache):
    """KV cache for tree-attention decoding of up to ``slots`` requests; pass it as ``past_key_values``.

    ``capacity`` is the initial number of positions per slot (prompt + generated + one draft tree).
    """

    def __init__(self, slots: int, capacity: int) -> None:
        self.slots, self.capacity = slots, capacity
        self.rows = 0
        # Cache calls the factory with no arguments for each new layer; it is typed as taking a layer class
        super().__init__(layer_class_to_replicate=self._new_layer)  # type: ignore[arg-type]

    def _new_layer(self) -> _SlotLayer:
        return _SlotLayer(self.slots, self.capacity, self.rows)

    def _slot_layers(self) -> list[_SlotLayer]:
        # every layer comes from _new_layer
        return cast(list[_SlotLayer], self.layers)

    @property
    def used(self) -> int:
        return self._slot_layers()[0].used if self.layers else 0

    def resize(self, rows: int, used: int) -> None:
        """Expose rows ``[0, rows)`` and slots ``[0, used)`` to the next forward."""
        self.rows = rows
        for layer in self._slot_layers():
            layer.set_rows(rows, used)

    def write_rows(self, rows: list[int], prefill: Cache) -> None:
        """Copy a prefill cache's rows (one per new request, right-padded) into slot rows ``rows``."""
        while len(self.layers) < len(prefill.layers):
            self.layers.append(self._new_layer())
        sources = [layer_kv(src) for src in prefill.layers]
        index = torch.tensor(rows, dtype=torch.long, device=sources[0][0].device)
        for layer, (keys, values) in zip(self._slot_layers(), sources):
            layer.write_rows(index, keys, values)

    def move_row(self, src: int, dst: int, width: int) -> None:
        """Copy row ``src``'s first ``width`` entries to row ``dst`` (compaction after a request leaves)."""
        for layer in self._slot_layers():
            layer.move_row(src, dst, width)

    def reserve(self, slots: int) -> None:
        for layer in self._slot_layers():
            layer.reserve(slots)

    def keep_slots(self, starts: list[int], slots: list[list[int]]) -> None:
        """For each active row b, move slots ``slots[b]`` (in order) to ``starts[b]`` onwards; the rest of
        the row beyond them is dropped. Sources are read before anything is written."""
        b_idx: list[int] = []
        src: list[int] = []
        dst: list[int] = []
        for row, (start, keep) in enumerate(zip(starts, slots)):
            for j, slot in enumerate(keep):
                if slot != start + j:
                    b_idx.append(row)
                    src.append(slot)
                    dst.append(start + j)
        used = max(start + len(keep) for start, keep in zip(starts, slots))
        layers = self._slot_layers()
        device = layers[0].device

        def as_t(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.long, device=device)

        b_t, src_t, dst_t = as_t(b_idx), as_t(src), as_t(dst)
        for layer in layers:
            layer.keep(b_t, src_t, dst_t, used)


def layer_kv(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill cache layer's keys and values (any layer object holding both as tensors)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError(f"prefill cache layer {type(layer).__name__} holds no key/value tensors")
    return keys, values
