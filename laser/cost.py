"""The engine's cost model: seconds of one target forward against its shape.

A decoding forward runs ``rows`` requests with ``nodes`` tree tokens each over a cached context. Its
time is measured once per device, model, dtype and thread count on a grid of shapes (rows x nodes,
powers of two), cached as JSON for the next run, and interpolated bilinearly in log2 space. Beyond
the measured rows a forward costs what the widest measured one costs for as many tokens (128 rows x 1
token as 64 x 2: a batch that wide is compute-bound, so a draft token there costs about what a row's
token does); beyond the measured tokens per row the time grows in proportion to the tokens.

:class:`ForwardCost` is the one step-cost table of both engines, cached under :func:`cost_cache_dir`:
the hf engine's tree forwards are timed here (:func:`forward_cost`, priced by :mod:`laser.budget`); the
vLLM engine's whole steps are timed by :mod:`laser.vllm.calibrate` into the same type, which
:class:`laser.vllm.step_cost.StepCost` corrects online for the vLLM proposer's chain budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

log = logging.getLogger(__name__)

ROWS = (1, 2, 4, 8, 16, 32, 64)
NODES = (1, 2, 4, 8, 16, 32, 64)
MAX_MEASURED_TOKENS = 512  # larger shapes are extrapolated, not timed
CONTEXT = 256  # cached positions per row while timing


def cost_cache_dir() -> Path:
    """Where measured cost models are kept: ``<laser cache>/cost-models`` (``LASER_CACHE_DIR``)."""
    from laser.models import cache_dir

    return cache_dir() / "cost-models"


@dataclass
class ForwardCost:
    """Measured forward seconds ``seconds[i][j]`` for ``rows[i]`` requests x ``nodes[j]`` tree tokens."""

    key: str
    rows: list[int]
    nodes: list[int]
    seconds: list[list[float]]
    context: int = CONTEXT
    measured: dict[str, float] = field(default_factory=dict)  # "rows x nodes" -> seconds actually timed

    def time(self, rows: float, nodes: float) -> float:
        """Predicted seconds of one forward of ``rows`` requests with ``nodes`` tokens each."""
        return float(self.times(rows, nodes))

    def times(self, rows_: npt.ArrayLike, nodes_: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """:meth:`time` over arrays (broadcast): one evaluation for many shapes."""
        rows, nodes = np.broadcast_arrays(
            np.maximum(np.asarray(rows_, dtype=float), 1.0), np.maximum(np.asarray(nodes_, dtype=float), 1.0)
        )
        # beyond the measured rows, a forward costs what the widest measured one costs for as many tokens
        over = np.maximum(rows / self.rows[-1], 1.0)
        rows, nodes = rows / over, nodes * over
        r, n = np.log2(rows), np.log2(nodes)
        gr, gn = np.log2(self.rows), np.log2(self.nodes)
        table = np.asarray(self.seconds, dtype=float)
        # bilinear in (log rows, log nodes), clamped to the grid; then proportional beyond it
        i = np.clip(np.searchsorted(gr, r) - 1, 0, len(gr) - 2)
        j = np.clip(np.searchsorted(gn, n) - 1, 0, len(gn) - 2)
        tr = np.clip((r - gr[i]) / (gr[i + 1] - gr[i]), 0, 1)
        tn = np.clip((n - gn[j]) / (gn[j + 1] - gn[j]), 0, 1)
        t = (
            (1 - tr) * (1 - tn) * table[i, j]
            + tr * (1 - tn) * table[i + 1, j]
            + (1 - tr) * tn * table[i, j + 1]
            + tr * tn * table[i + 1, j + 1]
        )
        return np.asarray(t * np.maximum(nodes / self.nodes[-1], 1.0), dtype=np.float64)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes measuring at once never share a temp file
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "ForwardCost":
        return cls.from_json(path.read_text())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ForwardCost":
        return cls(**json.loads(text))


def cost_key(model: torch.nn.Module) -> str:
    """What the timings depend on: the model's shape, dtype, device, attention backend and threads."""
    p = next(model.parameters())
    cfg: Any = model.config  # a transformers config (its fields are not typed)
    parts = [
        type(model).__name__,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        cfg.intermediate_size,
        cfg.vocab_size,
        str(p.dtype),
        torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else "cpu",
        getattr(cfg, "_attn_implementation", None),
        torch.get_num_threads(),
        torch.__version__,
    ]
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def forward_cost(
    model: torch.nn.Module,
    cache_dir: Path | None = None,
    repeats: int = 2,
    rows: tuple[int, ...] = ROWS,
    nodes: tuple[int, ...] = NODES,
) -> ForwardCost:
    """The model's cost model, from the cache when this device/model/dtype/threads was measured before."""
    key = cost_key(model)
    path = (cache_dir or cost_cache_dir()) / f"{key}.json"
    if path.exists():
        try:
            cost = ForwardCost.load(path)
            if cost.key == key and cost.rows == list(rows) and cost.nodes == list(nodes):
                return cost
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("cost model %s unreadable (%s); measuring again", path, exc)
    cost = measure(model, key, rows, nodes, repeats)
    cost.save(path)
    return cost


@torch.inference_mode()
def measure(
    model: torch.nn.Module, key: str, rows: tuple[int, ...], nodes: tuple[int, ...], repeats: int = 2
) -> ForwardCost:
    """Time tree forwards (4D mask, explicit positions) after a ``CONTEXT``-token cache, per shape."""
    from transformers.cache_utils import DynamicCache

    from laser.kv_cache import SlotKVCache
    from laser.tree import additive_mask

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    cfg: Any = model.config  # a transformers config (its fields are not typed)
    vocab = int(cfg.vocab_size)
    log.info("measuring the forward cost model (%d shapes; cached for the next run)", len(rows) * len(nodes))
    measured: dict[str, float] = {}
    context = DynamicCache()  # one row's context, copied into every row (timings do not depend on contents)
    model(
        input_ids=torch.randint(0, vocab, (1, CONTEXT), generator=gen).to(device),
        past_key_values=context,
        use_cache=True,
    )
    for b in rows:
        cache = SlotKVCache(b, CONTEXT + max(nodes))
        layers: list[Any] = list(context.layers)
        wide: Any = SimpleNamespace(
            layers=[
                SimpleNamespace(keys=layer.keys.expand(b, -1, -1, -1), values=layer.values.expand(b, -1, -1, -1))
                for layer in layers
            ]
        )
        cache.write_rows(list(range(b)), wide)
        for n in nodes:
            if b * n > MAX_MEASURED_TOKENS:
                continue
            ids = torch.randint(0, vocab, (b, n), generator=gen).to(device)
            pos = (CONTEXT + torch.arange(n, device=device)).expand(b, n)
            seen = torch.ones(b, 1, n, CONTEXT + n, dtype=torch.bool, device=device)
            seen[..., CONTEXT:] = torch.tril(torch.ones(n, n, dtype=torch.bool, device=device))
            mask = additive_mask(seen, dtype)
            times = []
            for _ in range(repeats + (n == nodes[0])):  # the first shape of a row count warms up
                cache.resize(b, CONTEXT)
                sync()
                t0 = time.perf_counter()
                model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
                sync()
                times.append(time.perf_counter() - t0)
            measured[f"{b}x{n}"] = min(times[-repeats:])
    table = [[_fill(measured, b, n, nodes) for n in nodes] for b in rows]
    return ForwardCost(key=key, rows=list(rows), nodes=list(nodes), seconds=table, measured=measured)


def _fill(measured: dict[str, float], b: int, n: int, nodes: tuple[int, ...]) -> float:
    """A timed shape's seconds, or the largest timed shape of that row count scaled by tokens."""
    if f"{b}x{n}" in measured:
        return measured[f"{b}x{n}"]
    timed = [m for m in nodes if f"{b}x{m}" in measured]
    top = max(timed)
    return measured[f"{b}x{top}"] * n / top
