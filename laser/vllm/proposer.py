"""LASER as vLLM's drafter: a ``custom_class`` proposer (vLLM's proposer hook; no vLLM file is forked).

vLLM builds the class as ``LaserProposer(vllm_config)`` inside its model runner and calls, after every
step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: row i of the batch has context
``token_ids_cpu[i, :num_tokens_no_spec[i]]`` and just received ``sampled_token_ids[i]`` (the accepted
drafts of the last step, then the target's own token). It returns each row's draft chain.

Each row belongs to a request; the model runner's ``input_batch.req_ids[i]`` names it and
``runner.requests[req_id].sampling_params.extra_args["laser"]`` carries what the request asked for:

- ``pool``: the key of its routed pool, a :class:`laser.drafting.DraftSource` registered in this
  process (:func:`laser.vllm.pools.register_source`); no key or an unknown one drafts from the request's
  own prompt and output only (prompt lookup: the temporary branches every pool drafter keeps);
- ``k``, ``p``: relaxed verification for this request (absent: vLLM's own rule; greedy is lossless);
- ``tag``: the caller's id for the request's statistics (accepted drafts, steps);
- ``draft``: False for a request that drafts nothing (plain decoding in a laser engine);
- ``n_max``, ``min_prob``: the pool's retrieval knobs (as :class:`laser.decoders.base.RetrievalDecoder`).

The runner is found once, when vLLM constructs the proposer (it is the caller's ``self``); that needs
the model runner in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and one CPU/GPU worker), which
is how :class:`laser.vllm.VllmEngine` runs vLLM. Each request opens one drafter from its pool, fed the
new tokens every step and closed when the request leaves the batch. Drafters propose trees; vLLM
verifies chains, so the row drafts the tree's first root-to-leaf path (the most frequent child at each
depth; temporary branches first). Lengths come from :class:`laser.vllm.budget.ChainBudget`.
"""
from __future__ import annotations

import inspect
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from laser.drafting import Drafter, NoDrafter
from laser.vllm import pools
from laser.vllm.budget import ChainBudget
from laser.vllm.relaxed import RelaxedRejectionSampler

log = logging.getLogger(__name__)

LIVE: "weakref.WeakValueDictionary[int, LaserProposer]" = weakref.WeakValueDictionary()  # by vllm_config id
RETRIEVE_NODES = 2  # tree nodes asked of the drafter per chain token wanted (room for siblings)


@dataclass
class _Row:
    drafter: Drafter
    seen: int  # context tokens the drafter has been told about
    tag: Any
    rule: tuple[int, float] | None
    force_cycle: list[int] | None = None  # calibration: junk drafts of these lengths, one per step in turn
    drafted: int = 0  # drafts proposed last step
    steps: int = 0
    accepted: int = 0


@dataclass
class StepLog:
    """Wall seconds between successive ``propose`` calls with the batch's shape (for the cost model)."""

    last_t: float | None = None
    last_shape: tuple | None = None
    times: dict = field(default_factory=dict)  # (rows, draft_len) -> [seconds]


class LaserProposer:
    """vLLM ``custom_class`` proposer drafting from routed LASER pools (see the module docstring)."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        spec = vllm_config.speculative_config
        self.max_len = int(spec.num_speculative_tokens)
        self.runner = _find_runner()
        self.rows: dict[str, _Row] = {}
        self.stats: dict[Any, tuple[int, int]] = {}  # tag -> (steps, accepted drafts) of finished rows
        self.budget = ChainBudget(cost=None, max_len=self.max_len, fixed=self.max_len)
        self.n_max = 8
        self.steps = 0
        self.step_log: StepLog | None = None
        LIVE[id(vllm_config)] = self

    # vLLM hooks ---------------------------------------------------------------------------------
    def load_model(self, *args, **kwargs) -> None:
        """No weights; wraps the runner's rejection sampler so relaxed requests get their rule."""
        sampler = getattr(self.runner, "rejection_sampler", None)
        if sampler is not None and not isinstance(sampler, RelaxedRejectionSampler):
            self.runner.rejection_sampler = RelaxedRejectionSampler(sampler, self._rules)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **kwargs) -> list[list[int]]:
        now = time.perf_counter()
        req_ids = list(self.runner.input_batch.req_ids)
        self._log_step(now, req_ids)
        self._drop_finished(req_ids)
        self.steps += 1
        n = len(req_ids)
        active, chains = [], []
        for i, rid in enumerate(req_ids):
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            if not sampled:  # a prefill chunk, or a row that produced nothing this step
                continue
            length = int(num_tokens_no_spec[i])
            row = self.rows.get(rid) or self._open(rid, token_ids_cpu[i, :length])
            if row.drafted:
                got = len(sampled) - 1
                row.accepted += got
                self.budget.observe(rid, row.drafted, got)
            row.steps += 1
            context = token_ids_cpu[i, :length].tolist()
            if length > row.seen:
                row.drafter.commit(context[row.seen:])
                row.seen = length
            if row.force_cycle:
                cycle = row.force_cycle
                chain = [3 + (context[-1] + j) % 2 for j in range(cycle[self.steps % len(cycle)])]  # junk
            else:
                tree = row.drafter.propose(context, RETRIEVE_NODES * self.max_len)
                chain = tree.first_path()[: self.max_len]
            active.append(i)
            chains.append(chain)
        keys = [req_ids[i] for i in active]
        forced = [bool(self.rows[k].force_cycle) for k in keys]
        lengths = self.budget.lengths(keys, [len(c) for c in chains])
        out: list[list[int]] = [[] for _ in range(n)]
        for i, key, chain, L, f in zip(active, keys, chains, lengths, forced):
            take = chain if f else chain[:L]
            out[i] = take
            self.rows[key].drafted = len(take)
        if self.step_log is not None:
            self.step_log.last_shape = (tuple(req_ids), tuple(len(o) for o in out))
        return out

    # helpers ------------------------------------------------------------------------------------
    def _open(self, rid: str, prompt_and_output) -> _Row:
        state = self.runner.requests.get(rid)
        args = ((state.sampling_params.extra_args or {}).get("laser") or {}) if state else {}
        prompt = list(state.prompt_token_ids or []) if state else list(prompt_and_output)
        if args.get("draft") is False:  # plain decoding inside a laser engine
            drafter: Drafter = NoDrafter()
        else:
            source = pools.get_source(args.get("pool"))
            drafter = source.open(prompt, RETRIEVE_NODES * self.max_len, int(args.get("n_max", self.n_max)),
                                  float(args.get("min_prob", 0.0)))
        rule = (int(args["k"]), float(args["p"])) if args.get("k") is not None else None
        row = _Row(drafter=drafter, seen=len(prompt), tag=args.get("tag", rid), rule=rule,
                   force_cycle=args.get("force_cycle"))
        self.rows[rid] = row
        return row

    def _drop_finished(self, req_ids: list[str]) -> None:
        if len(self.rows) <= len(req_ids) and all(r in self.rows for r in req_ids):
            return
        live = set(req_ids) | set(getattr(self.runner, "requests", {}) or {})
        for rid in [r for r in self.rows if r not in live]:
            self._close(rid)

    def _close(self, rid: str) -> None:
        row = self.rows.pop(rid)
        row.drafter.close()
        self.stats[row.tag] = (row.steps, row.accepted)
        self.budget.forget(rid)

    def take_stats(self, tag) -> tuple[int, int] | None:
        """(steps, accepted drafts) of a finished request by its tag; its row is closed if still open."""
        if tag in self.stats:
            return self.stats.pop(tag)
        for rid, row in list(self.rows.items()):
            if row.tag == tag:
                self._close(rid)
                return self.stats.pop(tag)
        return None

    def finish_all(self) -> None:
        """Close the drafters of requests that left vLLM (called after a ``generate``)."""
        self._drop_finished([])

    def _rules(self) -> list[tuple[int, float] | None]:
        return [(self.rows[r].rule if r in self.rows else None) for r in self.runner.input_batch.req_ids]

    def _log_step(self, now: float, req_ids: list[str]) -> None:
        log_ = self.step_log
        if log_ is None:
            return
        if log_.last_shape is not None and log_.last_t is not None and log_.last_shape[0] == tuple(req_ids):
            lens = set(log_.last_shape[1])
            if len(lens) == 1:
                log_.times.setdefault((len(req_ids), lens.pop()), []).append(now - log_.last_t)
        log_.last_t = now


def _find_runner():
    """The vLLM model runner constructing this proposer (the ``self`` of a calling frame)."""
    for frame_info in inspect.stack()[1:40]:
        obj = frame_info.frame.f_locals.get("self")
        if obj is not None and any(c.__name__ == "GPUModelRunner" for c in type(obj).__mro__):
            return obj
    raise RuntimeError("LaserProposer must be built by vLLM's model runner (speculative_config method "
                       "'custom_class'), in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0")
