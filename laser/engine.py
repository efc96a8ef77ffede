"""The one decoding loop every decoder runs: prefill, then per step propose -> one target forward under
tree attention -> verify -> keep the accepted KV -> commit, for a batch of requests at once.

Per-request state (tokens, drafter, sampling generator, cache length, stats) lives in :class:`Request`;
the model call and verification act on the whole padded batch. Requests leave the batch when they
finish. Drafters and verifiers are plug-ins (``laser.drafting``, ``laser.verify``); the engine only
packs trees, runs the forward, compacts the cache and keeps the stats.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar, cast

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from laser.kv_cache import SlotKVCache
from laser.drafting import Drafter
from laser.request import Request
from laser.rules import TokenText, apply_rules, stop_string_hit
from laser.tree import DraftTree, TreeBatch, pack_trees
from laser.verify import Outcome, Verifier

if TYPE_CHECKING:
    from laser.budget import BudgetPolicy

TREE_ROOM = 128  # KV positions reserved per slot beyond prompt + new tokens, for one step's draft tree

# Attention backends known to apply a custom 4D additive mask. Others (flash_attention_2 takes only
# padding masks, kernels that assume causality) would silently attend to sibling branches of a tree.
TREE_MASK_BACKENDS = ("eager", "sdpa")

T = TypeVar("T")


class _Clock:
    """Adds elapsed wall time to a stats field of every active request (device synchronised)."""

    def __init__(self, device: torch.device):
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(self, seqs: list[Request], field_name: str, fn: Callable[[], T]) -> T:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        dt = time.perf_counter() - t0
        for s in seqs:
            setattr(s.stats, field_name, getattr(s.stats, field_name) + dt)
        return out


@dataclass(frozen=True)
class StepRecord:
    """One decoding forward: its shape, times and tokens (for throughput reports and the cost model)."""

    rows: int
    nodes: int  # tree tokens per row (padded width)
    forward_s: float
    step_s: float  # the whole step: drafting, packing, forward, verification, KV compaction
    drafted: int  # draft tokens proposed, all rows
    accepted: int  # draft tokens accepted, all rows


@dataclass
class EngineLog:
    """What the engine did since the last ``clear``: every decoding step, and prefill totals."""

    steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=200_000))
    prefill_s: float = 0.0
    prefill_forwards: int = 0
    decode_s: float = 0.0  # decoding steps' seconds (prefill excluded)
    decode_tokens: int = 0  # tokens the decoding steps gave their requests

    def clear(self) -> None:
        self.steps.clear()
        self.prefill_s, self.prefill_forwards, self.decode_s, self.decode_tokens = 0.0, 0, 0.0, 0


def check_tree_attention(model: torch.nn.Module) -> None:
    """Refuse attention backends that would ignore the tree mask (silently wrong tokens otherwise)."""
    backend = getattr(model.config, "_attn_implementation", None) or "eager"
    if backend not in TREE_MASK_BACKENDS:
        raise ValueError(
            f"attention backend {backend!r} ignores custom 4D tree masks; load the model with "
            f"attn_implementation in {TREE_MASK_BACKENDS} (e.g. model.set_attn_implementation('sdpa'))"
        )


def check_cached(s: Request, tree: DraftTree) -> None:
    """A tree's ``cached`` nodes must be exactly the nodes the request kept last step, in the same order."""
    n, kept = s.kv_len - s.cache_len, s.kept
    same = tree.cached == n and (
        n == 0
        or kept is not None
        and np.array_equal(tree.tokens[:n], kept.tokens)
        and np.array_equal(tree.parents[:n], kept.parents)
    )
    if not same:
        raise RuntimeError(
            f"{type(s.drafter).__name__} laid out a tree whose {tree.cached} cached nodes are not the "
            f"{n} nodes kept in the cache"
        )


def kept_slots(s: Request, tree: DraftTree, o: Outcome, offset: int) -> list[int]:
    """Cache slots of the nodes the outcome keeps (its path, or ``keep``): a cached node j sits at
    ``cache_len + j``, a fed node i at ``offset + i - cached``."""
    nodes = o.path if o.keep is None else o.keep
    return [s.cache_len + n if n < tree.cached else offset + n - tree.cached for n in nodes]


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The kept nodes as a tree (root first, each after its parent), parents renumbered."""
    where = {node: j for j, node in enumerate(keep)}
    parents = [where.get(int(tree.parents[n]), -2) if tree.parents[n] >= 0 else -1 for n in keep]
    if keep[0] != 0 or -2 in parents:
        raise RuntimeError(f"kept nodes {keep} must start at the root and list each parent before its children")
    return DraftTree(tree.tokens[keep], np.array(parents), cached=0)


class TreeDecodingEngine:
    """Decodes requests with one verifier, continuously: up to ``slots`` requests share each forward.

    A finished request leaves at once and a waiting one is prefilled into its slot (several waiting
    requests in one padded forward, long prompts in chunks of ``prefill_tokens``), so the batch stays full
    until the queue drains. ``budget`` (a :class:`laser.budget.BudgetPolicy`) sets every row's draft
    budget each step; without one each request keeps its own ``budget``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        verifier: Verifier,
        eos_ids: set[int],
        budget: "BudgetPolicy | None" = None,
        prefill_tokens: int = 2048,
    ):
        check_tree_attention(model)
        self.model = model
        self.verifier = verifier
        self.eos_ids = eos_ids
        self.budget = budget
        self.prefill_tokens = prefill_tokens
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.clock = _Clock(self.device)
        self.log = EngineLog()
        self.token_text: TokenText | None = None  # needed by requests with stop strings (set by the decoder)

    def run(self, seqs: list[Request], slots: int | None = None) -> list[Request]:
        """Decode ``seqs`` to the end, at most ``slots`` at a time (default: all at once)."""
        queue = deque(seqs)
        capacity = max(len(s.tokens) + s.max_new_tokens for s in seqs) + TREE_ROOM
        for _ in self.stream(
            lambda n: [queue.popleft() for _ in range(min(n, len(queue)))], slots or len(seqs), capacity
        ):
            pass
        return seqs

    def batch(self, slots: int, capacity: int = 1024) -> "ContinuousBatch":
        """An empty continuous batch of up to ``slots`` rows on this engine (see :class:`ContinuousBatch`)."""
        return ContinuousBatch(self, slots, capacity)

    def stream(self, take: Callable[[int], list[Request]], slots: int, capacity: int = 1024) -> Iterator[Request]:
        """Decode requests pulled from ``take(n)`` (up to n waiting ones; [] when none is waiting) in up to
        ``slots`` rows; yields each request as it finishes. Ends when no row is active and none is waiting.

        ``capacity`` is the KV positions preallocated per slot (prompt + new tokens + one draft tree); a
        longer request grows the buffers once.
        """
        batch = self.batch(slots, capacity)
        while True:
            new = take(batch.free) if batch.free else []
            if new:
                batch.add(new)
            if not batch.live:
                return
            yield from batch.step()

    def _prefill(self, seqs: list[Request], rows: list[int], cache: SlotKVCache) -> None:
        """Cache every prompt token but the last (the first step's root) in slot rows ``rows``.

        Prompts are right-padded and run causally without an explicit mask (SDPA's fast causal path), in
        chunks of at most ``prefill_tokens`` padded tokens: a valid token never sees a later pad, and pad
        slots stay hidden afterwards (``cache_len``).
        """
        lens = [len(s.tokens) - 1 for s in seqs]
        width = max(lens)
        for s, n in zip(seqs, lens):
            s.cache_len = n
        if width == 0:
            return

        want_hidden = any(s.drafter.needs_hidden for s in seqs)

        def forward() -> None:
            ids = torch.tensor([s.tokens[:-1] + [0] * (width - n) for s, n in zip(seqs, lens)], device=self.device)
            tmp = DynamicCache()
            chunk = max(1, self.prefill_tokens // len(seqs))
            for at in range(0, width, chunk):
                out = self.model(
                    input_ids=ids[:, at : at + chunk],
                    past_key_values=tmp,
                    use_cache=True,
                    output_hidden_states=want_hidden,
                )
                # a drafter that reads the target's state gets it at the last cached prompt token, the
                # position whose next token is the first step's root (as after a decoding step)
                for i, (s, n) in enumerate(zip(seqs, lens)):
                    if want_hidden and s.drafter.needs_hidden and at < n <= at + chunk:
                        s.drafter.commit([], out.hidden_states[-1][i, n - 1 - at])
            cache.write_rows(rows, tmp)

        t0 = time.perf_counter()
        self.clock.timed(seqs, "prefill_s", forward)
        self.log.prefill_s += time.perf_counter() - t0
        self.log.prefill_forwards += 1

    def _propose(self, seqs: list[Request]) -> list[DraftTree]:
        """Every request's tree; drafters of one class propose together (one draft forward for a batch)."""
        by_row: dict[int, DraftTree] = {}
        by_class: dict[type[Drafter], list[int]] = defaultdict(list)
        for i, s in enumerate(seqs):
            by_class[type(s.drafter)].append(i)
        for cls, rows in by_class.items():
            made = cls.propose_batch(
                [seqs[i].drafter for i in rows], [seqs[i].tokens for i in rows], [seqs[i].budget for i in rows]
            )
            by_row.update(zip(rows, made))
        return [by_row[i] for i in range(len(seqs))]

    def _step(self, seqs: list[Request], cache: SlotKVCache) -> list[Request]:
        """One speculative step for every active request; returns those that finished."""
        step_t0 = time.perf_counter()
        if self.budget is not None:
            self.budget.assign(seqs)
        trees = self.clock.timed(seqs, "retrieval_s", lambda: self._propose(seqs))
        for s, tree in zip(seqs, trees):
            check_cached(s, tree)
        offset = cache.used
        batch = self.clock.timed(
            seqs, "tree_s", lambda: pack_trees(trees, [s.cache_len for s in seqs], offset, self.dtype, self.device)
        )
        out, forward_s = self._forward(seqs, batch, cache, offset)
        outcomes: list[Outcome] = self.clock.timed(
            seqs, "verify_s", lambda: self.verifier.verify(self._logits(out.logits, trees, seqs), batch, seqs)
        )
        self.clock.timed(
            seqs,
            "cache_s",
            lambda: cache.keep_slots(
                [s.cache_len for s in seqs], [kept_slots(s, t, o, offset) for s, t, o in zip(seqs, trees, outcomes)]
            ),
        )
        finished = [s for row, s in enumerate(seqs) if self._advance(s, trees[row], outcomes[row], out, row)]
        step_s = time.perf_counter() - step_t0
        for s in seqs:
            s.stats.decode_s += step_s
        self.log.decode_s += step_s
        accepted = sum(max(len(o.path) - 1, 0) for o in outcomes)
        drafted = sum(len(t) - 1 for t in trees)
        self.log.steps.append(StepRecord(len(seqs), batch.input_ids.shape[1], forward_s, step_s, drafted, accepted))
        if self.budget is not None:
            self.budget.observe(seqs, trees, outcomes, step_s=step_s, forward_s=forward_s)
        return finished

    def _forward(self, seqs: list[Request], batch: TreeBatch, cache: SlotKVCache, offset: int) -> tuple[Any, float]:
        """The target's forward over the step's packed trees: its output and seconds."""
        # One token per row over fully valid caches needs no mask (SDPA's fast path), as in plain decoding.
        plain = batch.input_ids.shape[1] == 1 and all(s.kv_len == offset and s.kept is None for s in seqs)
        want_hidden = any(s.drafter.needs_hidden for s in seqs)
        t0 = time.perf_counter()
        out = self.clock.timed(
            seqs,
            "forward_s",
            lambda: self.model(
                input_ids=batch.input_ids,
                attention_mask=None if plain else batch.attention_mask,
                position_ids=batch.position_ids,
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=want_hidden,
            ),
        )
        return out, time.perf_counter() - t0

    def _advance(self, s: Request, tree: DraftTree, o: Outcome, out: Any, row: int) -> bool:
        """Take request ``s``'s verified tokens (clipped by its limits and its halt) and tell its drafter;
        True when it finished."""
        s.cache_len += len(o.path)
        s.kept = subtree(tree, o.keep) if o.keep else None
        s.stats.target_forwards += 1
        s.stats.accepted_per_step.append(max(len(o.path) - 1, 0))
        s.stats.drafted_per_step.append(len(tree) - 1)
        new = self._clip(s, o.tokens)
        s.tokens.extend(new)
        self.log.decode_tokens += len(new)
        if not s.stats.finish_reason and s.halt is not None and (stop := s.halt(s.new_tokens)) is not None:
            s.stats.finish_reason, keep = stop
            del s.tokens[s.prompt_len + keep :]
        if o.finished and not s.stats.finish_reason:
            s.stats.finish_reason = "verifier"
        if s.stats.finish_reason:
            return True
        hidden = out.hidden_states[-1][row, o.path[-1] - tree.cached] if s.drafter.needs_hidden and o.path else None
        self.clock.timed([s], "retrieval_s", lambda: s.drafter.commit(new, hidden))
        return False

    def _logits(self, logits: torch.Tensor, trees: list[DraftTree], seqs: list[Request]) -> torch.Tensor:
        """The target's logits with each request's generation rules applied (unchanged when none)."""
        if not any(s.rules.active for s in seqs):
            return logits
        return apply_rules(logits, trees, seqs, self.eos_ids)

    def _clip(self, s: Request, new: list[int]) -> list[int]:
        """Cut ``new`` at the first end-of-sequence token or the token budget, and record why."""
        room = s.max_new_tokens - len(s.new_tokens)
        new = new[:room]
        stops, token_text = s.rules.stop_strings, self.token_text
        if stops and token_text is None:
            raise ValueError("stop_strings need the model's tokenizer; this engine has none (LoadedModel.tokenizer)")
        for i, tok in enumerate(new):
            if tok in self.eos_ids:
                s.stats.finish_reason = "eos"
                return new[: i + 1]
            if (
                stops
                and token_text is not None
                and stop_string_hit(s.tokens[-max(map(len, stops)) - 1 :] + new[: i + 1], stops, token_text)
            ):
                s.stats.finish_reason = "stop"
                return new[: i + 1]
        if len(new) == room:
            s.stats.finish_reason = "length"
        return new


class ContinuousBatch:
    """Requests decoding together on one :class:`TreeDecodingEngine`, in up to ``slots`` rows of one KV
    cache: :meth:`add` prefills waiting requests into free rows, :meth:`step` runs one speculative step for
    every row and returns the requests that finished (their rows free at once). The pull-style form of
    :meth:`TreeDecodingEngine.stream`, for a caller that admits work between steps."""

    def __init__(self, engine: TreeDecodingEngine, slots: int, capacity: int = 1024) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.engine, self.slots = engine, slots
        self.cache = SlotKVCache(slots, capacity)
        self.active: list[Request | None] = []  # one per cache row; None: a row freed since the last step

    @property
    def live(self) -> int:
        """Requests decoding."""
        return sum(s is not None for s in self.active)

    @property
    def free(self) -> int:
        """Rows a new request may take."""
        return self.slots - self.live

    @torch.inference_mode()
    def add(self, new: list[Request]) -> None:
        """Prefill ``new`` into free rows (at most :attr:`free` of them)."""
        if len(new) > self.free:
            raise ValueError(f"{len(new)} requests for {self.free} free rows")
        if new:
            self._admit(new)

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One step for every live request; the requests that finished (none when none is live)."""
        self._compact()
        if not self.active:
            return []
        finished = self.engine._step(cast(list[Request], self.active), self.cache)  # _compact left no holes
        done = {id(s) for s in finished}
        self.active = [None if s is not None and id(s) in done else s for s in self.active]
        for s in finished:
            self._retire(s)
        return finished

    def _retire(self, s: Request) -> None:
        """A finished request's last stats; its drafter and budget let go."""
        s.drafter.close()
        s.stats.new_tokens = len(s.new_tokens)
        s.stats.prompt_tokens, s.stats.cached_prompt_tokens = s.prompt_len, 0  # no prefix cache here
        s.stats.own_accepted = getattr(s.drafter, "own_accepted", None)  # laser/earlier.py
        if self.engine.budget is not None:
            self.engine.budget.forget(s)

    def _admit(self, new: list[Request]) -> None:
        """Prefill ``new`` requests into free rows (holes first), several per padded forward."""
        active, cache, engine = self.active, self.cache, self.engine
        holes = [r for r, s in enumerate(active) if s is None]
        rows = holes[: len(new)] + list(range(len(active), len(active) + len(new) - len(holes)))
        active.extend([None] * (max(rows) + 1 - len(active)))
        group: list[int] = []
        for i, s in enumerate(new):
            width = max([len(new[j].tokens) - 1 for j in group] + [len(s.tokens) - 1])
            if group and width * (len(group) + 1) > engine.prefill_tokens:
                engine._prefill([new[j] for j in group], [rows[j] for j in group], cache)
                group = []
            group.append(i)
        engine._prefill([new[j] for j in group], [rows[j] for j in group], cache)
        for s, row in zip(new, rows):
            active[row] = s

    def _compact(self) -> None:
        """Close the holes finished requests left: the last live rows move into them."""
        active, cache = self.active, self.cache
        row = 0
        while row < len(active):
            last = active[-1]
            if last is None:
                active.pop()
            elif active[row] is None:
                cache.move_row(len(active) - 1, row, last.kv_len)
                active[row] = active.pop()
            else:
                row += 1
        cache.resize(len(active), max((s.kv_len for s in active if s is not None), default=0))
