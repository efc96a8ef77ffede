"""LASER as vLLM's drafter: a ``custom_class`` proposer (vLLM's proposer hook; no vLLM file is forked).

vLLM builds the class as ``LaserProposer(vllm_config)`` inside its model runner; LASER's vLLM plug-in
(:mod:`laser.vllm.plugin`, entry point ``vllm.general_plugins``) then attaches the runner to it
(:meth:`LaserProposer.attach`) and gives the runner the rejection sampler with the relaxed rule. After
every step vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``: row i of the
batch has context ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` and just received ``sampled_token_ids[i]``
(the accepted drafts of the last step, then the target's own token). It returns each row's draft chain.

Each row belongs to a request; the model runner's ``input_batch.req_ids[i]`` names it and
``runner.requests[req_id].sampling_params.extra_args`` carries what the request asked for, a
:class:`laser.vllm.request_args.LaserArgs` (read back with ``LaserArgs.from_extra_args``: another version,
an unknown key or a malformed value is refused with the request's id). Its ``pool`` is opened from its
``pool_store`` in this process (:class:`laser.vllm.sources.StorePools`; works with vLLM's engine core in
another process) or, without a store, names a source registered in this process
(:func:`laser.vllm.sources.register_source`). A key found nowhere is counted (``unknown_pools``) and
logged once, and the request decodes without drafts. No ``pool``: the request drafts from its own
prompt and output (prompt lookup).

Each step first asks every row's drafter how much of the row's text it matches (a cheap lookup), then
chooses every row's draft length from that and the row's acceptance (:class:`laser.vllm.chain_budget.ChainBudget`,
owned by the proposer: :meth:`LaserProposer.reset_budget`, :meth:`LaserProposer.trial_budget`),
then retrieves only for rows that draft (drafters propose trees; vLLM verifies chains, so a row drafts the
tree's first root-to-leaf path). Drafters are fed only the tokens that are new since the last step.
The budget's step-cost table comes from the environment variable :data:`COST_ENV` (a
:class:`laser.cost.ForwardCost` as JSON, set by :class:`laser.vllm.VllmEngine` before vLLM starts, so it
reaches vLLM's worker processes too), else the shipped prior scaled to the model
(:func:`laser.vllm.step_cost.prior_cost`); either way corrected online.
The step's wall seconds and the proposer's own seconds go to the budget's ``observe_step`` when it has
one, and the steps in which no request prefilled go to :attr:`LaserProposer.decode_clock` (the engine's
decode-only time and tokens).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from laser.cost import ForwardCost
from laser.defaults import RELAXED_FRESH_N
from laser.drafting import DraftSource, Drafter
from laser.earlier import with_earlier
from laser.vllm import sources
from laser.vllm.chain_budget import ChainBudget
from laser.vllm.request_args import LaserArgs
from laser.vllm.step_cost import prior_cost
from laser.verify import repeats

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch
    from transformers import PreTrainedTokenizerBase
    from laser.vllm.relaxed import Rule
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRIEVE_NODES = 2  # tree nodes asked of the drafter per chain token wanted (room for siblings)
COST_ENV = "LASER_VLLM_STEP_COST"  # the budget's step-cost table (ForwardCost JSON) for every vLLM process


@dataclass
class RowStats:
    """One finished request's drafting statistics.

    Attributes:
        steps: target forwards that produced tokens for the request (one per engine step it decoded in,
            the prefill's first token included).
        accepted_per_step: draft tokens accepted at each step that verified drafts for the request, in
            order (steps where it drafted nothing are left out; the last entry may count drafts vLLM then
            cut at max_tokens or a stop). The same from vLLM's per-request metrics (engine core in another
            process, :meth:`from_spec_metrics`).
        drafted: draft tokens verified for the request in all (drafts of its last step, which vLLM drops
            when the request finishes, are not counted).
        draft_s: seconds the proposer spent on the request's drafter (feeding it tokens, retrieving
            drafts); None where not measured (stats from vLLM's metrics).
    """

    steps: int
    accepted_per_step: list[int] = field(default_factory=list)
    drafted: int = 0
    draft_s: float | None = None
    own_accepted: int | None = None  # accepted drafts from the request's earlier text (laser/earlier.py)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_step)

    @classmethod
    def from_spec_metrics(cls, metrics: Any, n_tokens: int) -> RowStats | None:
        """From vLLM's per-request speculative-decoding metrics (``CompletionOutput.spec_decode_metrics``,
        present when the engine was started with ``per_request_spec_decode_metrics="detailed"``);
        ``steps`` is the request's tokens minus its accepted drafts. None without metrics."""
        if metrics is None:
            return None
        per_step = list(getattr(metrics, "per_step_accepted", None) or [])
        if not per_step:  # "summary" level: the histogram of accepted drafts per verifying step
            per_step = [j for j, count in enumerate(metrics.histogram) for _ in range(count)]
        accepted = sum(per_step)
        return cls(
            steps=max(int(n_tokens) - accepted, 1), accepted_per_step=per_step, drafted=int(metrics.num_draft_tokens)
        )


@dataclass
class _Row:
    drafter: Drafter | None  # None: the request drafts nothing
    context: list[int]  # prompt + output the drafter has been told about
    tag: str
    rule: tuple[int, float] | None
    draft_len: int | None = None  # a fixed chain length the request asked for; None: the budget's choice
    force_cycle: tuple[int, ...] | None = None  # calibration: junk drafts of these lengths, one per step in turn
    drafted: int = 0  # drafts proposed last step
    prompt_len: int = 0
    stale: tuple[bool, ...] = ()  # last step's draft positions the relaxed rule may not accept (laser.verify.repeats)
    steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_total: int = 0
    draft_s: float = 0.0  # seconds spent feeding and asking the drafter


@dataclass
class DecodeClock:
    """Wall seconds and tokens of the engine steps in which no request prefilled (a step: one ``propose``
    call to the next, so drafting, scheduling, the forward and verification; every token it produced was
    decoded)."""

    seconds: float = 0.0
    tokens: int = 0


@dataclass
class StepLog:
    """Wall seconds between successive ``propose`` calls with the batch's shape (for the cost model)."""

    last_t: float | None = None
    last_shape: tuple[tuple[str, ...], tuple[int, ...]] | None = None  # (request ids, draft lengths)
    times: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (rows, draft_len) -> [seconds]


class LaserProposer:
    """vLLM ``custom_class`` proposer drafting from routed LASER pools (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from laser.vllm import plugin

        if plugin.PROBLEM is not None:
            raise RuntimeError(plugin.PROBLEM)
        self.vllm_config = vllm_config
        spec = vllm_config.speculative_config
        if spec is None or spec.num_speculative_tokens is None:
            raise ValueError("the laser proposer needs vLLM's speculative_config with num_speculative_tokens")
        self.max_len = int(spec.num_speculative_tokens)
        self.runner: Any = None  # vLLM's model runner, attached by the plug-in once vLLM built it
        self.rows: dict[str, _Row] = {}
        self.stats: sources.Bounded[str, RowStats] = sources.Bounded(sources.REMEMBERED)  # tag -> finished rows' stats
        self.budget = self.fresh_budget()  # the chain budget, owned here: reset_budget, trial_budget
        self.steps = 0
        self.step_log: StepLog | None = None  # set while calibrating
        self._cycle: tuple[int, ...] | None = None  # calibration: the junk draft lengths of new rows
        self.unknown_pools = 0  # requests whose pool key was found nowhere (they decode without drafts)
        self._warned_keys: sources.Bounded[Hashable, bool] = sources.Bounded(sources.REMEMBERED)
        self.store_pools = sources.StorePools(self._tokenizer)
        self._relaxed_open = 0
        self._last: tuple[float, float] | None = None  # end time and seconds of the last propose call
        self.decode_clock = DecodeClock()

    # vLLM hooks ---------------------------------------------------------------------------------
    def attach(self, runner: Any) -> None:
        """Called by the plug-in right after vLLM built ``runner`` with this proposer as its drafter: the
        proposer reads the batch from it, and its rejection sampler gets the relaxed rule."""
        from laser.vllm.bad_words import index_bad_words
        from laser.vllm.relaxed import build_sampler

        self.runner = runner
        runner.sampler = index_bad_words(runner.sampler)  # before the rejection sampler takes it for bonus tokens
        runner.rejection_sampler = build_sampler(runner, self._rules)

    def load_model(self, *args: object, **kwargs: object) -> None:
        """No weights; checks the plug-in attached the runner (else ONE line says why not)."""
        self._check_attached()

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: npt.NDArray[np.int32],
        token_ids_cpu: torch.Tensor,
        slot_mappings: object = None,
        **kwargs: object,
    ) -> list[list[int]]:
        now = time.perf_counter()
        self._check_attached()
        req_ids = list(self.runner.input_batch.req_ids)
        self._log_step(now, req_ids)
        self._drop_finished(req_ids)
        self.steps += 1
        out: list[list[int]] = [[] for _ in req_ids]
        drafting, chunked = self._take_verified(req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, now)
        budgeted = [(i, rid, row) for i, rid, row in drafting if not row.force_cycle]
        lengths = self._lengths(budgeted, prefilling=chunked) if budgeted else []
        for (i, rid, row), L in zip(budgeted, lengths):
            if L > 0 and row.drafter is not None:
                out[i] = self._chain(rid, row, int(L))
        self._settle(drafting, out)
        if self.step_log is not None:
            self.step_log.last_shape = (tuple(req_ids), tuple(len(o) for o in out))
        end = time.perf_counter()
        self._last = (end, end - now)
        return out

    def _take_verified(
        self,
        req_ids: list[str],
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: npt.NDArray[np.int32],
        token_ids_cpu: torch.Tensor,
        now: float,
    ) -> tuple[list[tuple[int, str, _Row]], bool]:
        """Count what each row's last drafts gave and tell its drafter the new tokens; returns the rows
        that draft (index, request id, row) and whether a prompt is being prefilled in chunks."""
        rows_decoded, verified, produced, prefill, chunked = 0, 0, 0, False, False
        drafting: list[tuple[int, str, _Row]] = []
        for i, rid in enumerate(req_ids):
            sampled = sampled_token_ids[i] if i < len(sampled_token_ids) else []
            if not sampled:  # a prefill chunk, or a row that produced nothing this step
                prefill = chunked = True
                continue
            length = int(num_tokens_no_spec[i])
            row = self.rows.get(rid)
            if row is None:
                row = self._open(rid, token_ids_cpu[i, :length])
                prefill = True
            got = len(sampled) - 1 if row.drafted else 0
            if row.drafted:
                self.budget.observe(rid, row.drafted, got)
                row.accepted_per_step.append(got)
                row.drafted_total += row.drafted
            rows_decoded += 1
            produced += len(sampled)
            verified += row.drafted
            row.steps += 1
            row.drafted = 0
            if length > len(row.context):
                self._commit(rid, row, token_ids_cpu[i, len(row.context) : length].tolist())
            if row.drafter is not None:
                drafting.append((i, rid, row))
        self._observe_step(now, rows_decoded, verified, produced, prefill)
        return drafting, chunked

    def _commit(self, rid: str, row: _Row, new: list[int]) -> None:
        """The row's new tokens, into its context and its drafter."""
        row.context.extend(new)
        if row.drafter is not None:
            t0 = time.perf_counter()
            self._guarded(rid, row, lambda d: d.commit(new))
            row.draft_s += time.perf_counter() - t0

    def _chain(self, rid: str, row: _Row, length: int) -> list[int]:
        """The row's draft chain of at most ``length`` tokens (none when its drafter fails)."""
        t0 = time.perf_counter()
        context, limit = row.context, RETRIEVE_NODES * length
        chain = self._guarded(rid, row, lambda d: d.propose_chain(context, limit))
        row.draft_s += time.perf_counter() - t0
        return (chain or [])[:length]

    def _settle(self, drafting: list[tuple[int, str, _Row]], out: list[list[int]]) -> None:
        """Record each drafting row's drafts (calibration rows get their forced junk) and, under the relaxed
        rule, which of them would extend a repetition of the row's own text."""
        for i, _, row in drafting:
            if row.force_cycle:
                cycle = row.force_cycle
                out[i] = [3 + (row.context[-1] + j) % 2 for j in range(cycle[self.steps % len(cycle)])]  # junk
            row.drafted = len(out[i])
            if row.rule is not None:  # relaxed acceptance never extends a repetition of the row's own text
                row.stale = tuple(repeats(row.context[row.prompt_len :], out[i], RELAXED_FRESH_N))

    # helpers ------------------------------------------------------------------------------------
    def _lengths(self, rows: list[tuple[int, str, _Row]], prefilling: bool) -> list[int]:
        """Each row's draft length from the budget, told how much of its text each drafter matched and
        whether prompts are still being prefilled in chunks."""
        t0 = time.perf_counter()
        matches = [self._guarded(rid, row, lambda d: d.match_length(row.context) or 0) or 0 for _, rid, row in rows]
        share = (time.perf_counter() - t0) / len(rows)
        for _, _, row in rows:
            row.draft_s += share
        return self.budget.lengths(
            [rid for _, rid, _ in rows],
            [self.max_len] * len(rows),
            matches,
            prefilling=prefilling,
            fixed=[row.draft_len for _, _, row in rows],
        )

    def _guarded(self, rid: str, row: _Row, call: Callable[[Drafter], T]) -> T | None:
        """``call`` on the row's drafter; a drafter that raises (a damaged pool, a bug) is dropped, logged once:
        the request decodes on without drafts and nothing reaches vLLM's engine loop."""
        if row.drafter is None:
            return None
        try:
            return call(row.drafter)
        except Exception:
            log.exception("request %s: its drafter failed; it decodes on without drafts", rid)
            row.drafter = None
            return None

    # the chain budget, owned here --------------------------------------------------------------------
    def fresh_budget(self, cost: ForwardCost | None = None) -> ChainBudget:
        """A chain budget that has learned nothing, on ``cost`` (default: this proposer's step-cost table)."""
        return ChainBudget(cost=cost if cost is not None else self._cost(), max_len=self.max_len)

    def reset_budget(self, cost: ForwardCost | None = None) -> None:
        """Start the chain budget afresh on ``cost`` (default: this proposer's table): it forgets the
        acceptance and step costs it learned (a benchmark's repeats start alike)."""
        self.budget = self.fresh_budget(cost)

    @contextmanager
    def trial_budget(self, cost: ForwardCost | None = None) -> Iterator[ChainBudget]:
        """A fresh chain budget on ``cost`` for the ``with`` block; the running budget is back after it."""
        saved, self.budget = self.budget, self.fresh_budget(cost)
        try:
            yield self.budget
        finally:
            self.budget = saved

    @contextmanager
    def calibrating(self, lens: Sequence[int]) -> Iterator[StepLog]:
        """Requests opened in the ``with`` block draft junk of ``lens`` tokens, one length per step in turn
        (rejected, so every row stays one token per step), and the steps' wall times are logged by shape
        (:class:`StepLog`); the running budget learns nothing from them and they leave no statistics."""
        saved = self.budget
        self.budget = ChainBudget(cost=None, max_len=self.max_len, fixed=self.max_len)
        self.step_log, self._cycle = StepLog(), tuple(int(L) for L in lens)
        try:
            yield self.step_log
        finally:
            self.step_log, self._cycle = None, None
            self.budget = saved
            self.finish_all()

    def _cost(self) -> ForwardCost:
        """The budget's step-cost table: :data:`COST_ENV` when set, else the shipped prior for this model."""
        table = os.environ.get(COST_ENV)
        if table:
            return ForwardCost.from_json(table)
        hf = getattr(getattr(self.vllm_config, "model_config", None), "hf_config", None)
        threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or None
        return prior_cost(hf.to_dict() if hf is not None else {}, threads)

    def _check_attached(self) -> None:
        if self.runner is None:
            from laser.vllm import plugin

            raise RuntimeError(plugin.not_attached_message())

    def _observe_step(self, now: float, rows: int, tokens_drafted: int, produced: int, prefill: bool) -> None:
        """The step that just ran (drafted by the previous call), when it only decoded: to
        :attr:`decode_clock` (the previous call and the step after it) and the budget's ``observe_step``."""
        last, self._last = self._last, None
        if last is None or prefill or rows == 0:
            return
        end, propose_s = last
        self.decode_clock.seconds += now - end + propose_s
        self.decode_clock.tokens += produced
        self.budget.observe_step(rows, rows + tokens_drafted, now - end, propose_s)

    def _open(self, rid: str, prompt_and_output: torch.Tensor) -> _Row:
        state = self.runner.requests.get(rid)
        params: SamplingParams | None = state.sampling_params if state is not None else None
        args = LaserArgs.from_extra_args(params.extra_args if params is not None else None, rid)
        if state is not None and state.prompt_token_ids is not None:
            prompt = list(state.prompt_token_ids)
        else:
            prompt = prompt_and_output.tolist()
        rule = args.rule
        if rule is not None:
            self._check_relaxed(rid, params)
        try:
            drafter = self._drafter(args, prompt)
        except Exception:  # a pool that cannot be opened for this prompt: no drafts, never the engine loop
            log.exception("request %s: its drafter could not be opened; it decodes without drafts", rid)
            drafter = None
        row = _Row(
            drafter=drafter,
            context=prompt,
            tag=args.tag if args.tag is not None else rid,
            rule=rule,
            draft_len=args.fixed_len,
            force_cycle=self._cycle,
            prompt_len=len(prompt),
        )
        self.rows[rid] = row
        self._relaxed_open += rule is not None
        return row

    def _check_relaxed(self, rid: str, params: SamplingParams | None) -> None:
        from laser.vllm.relaxed import RelaxedRule

        if not isinstance(getattr(self.runner, "rejection_sampler", None), RelaxedRule):
            raise RuntimeError(
                f"request {rid} asks for relaxed verification but the runner's rejection sampler "
                f"is {type(self.runner.rejection_sampler).__name__}, not laser's: refusing to "
                "verify it greedily"
            )
        if params is not None and params.temperature > 0:
            raise ValueError(
                f"request {rid}: relaxed verification is deterministic and needs temperature 0, "
                f"got {params.temperature}"
            )

    def _drafter(self, args: LaserArgs, prompt: list[int]) -> Drafter | None:
        if not args.draft:  # plain decoding inside a laser engine
            return None
        key, store = args.pool, args.pool_store
        source: DraftSource | None
        if key is None:
            source = sources.PromptLookup()
        elif store is not None:
            source = self.store_pools.get(store, key)
        else:
            source = sources.get_source(key)
        if key is not None and source is None:
            self.unknown_pools += 1
            if key not in self._warned_keys:
                self._warned_keys[key] = True
                where = f"pool store {store}" if store is not None else "the pools registered in this process"
                log.warning(
                    "pool %r is not in %s: its requests decode without drafts (counted in LaserProposer.unknown_pools)",
                    key,
                    where,
                )
            if not args.earlier:
                return None
        source = with_earlier(source, args.earlier)
        if source is None:
            return None
        return source.open(prompt, RETRIEVE_NODES * self.max_len, args.n_max, args.min_prob)

    def _tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (pool stores check their pools were built with it)."""
        from transformers import AutoTokenizer

        mc = self.vllm_config.model_config
        return AutoTokenizer.from_pretrained(
            mc.tokenizer,
            revision=getattr(mc, "tokenizer_revision", None),
            trust_remote_code=bool(getattr(mc, "trust_remote_code", False)),
        )

    def _drop_finished(self, req_ids: list[str]) -> None:
        if len(self.rows) <= len(req_ids) and all(r in self.rows for r in req_ids):
            return
        live = set(req_ids) | set(getattr(self.runner, "requests", {}) or {})
        for rid in [r for r in self.rows if r not in live]:
            self._close(rid)

    def _close(self, rid: str) -> None:
        row = self.rows.pop(rid)
        if row.drafter is not None:
            row.drafter.close()
        self._relaxed_open -= row.rule is not None
        if row.force_cycle is None:  # calibration rows leave no statistics
            self.stats[row.tag] = RowStats(
                steps=row.steps,
                accepted_per_step=row.accepted_per_step,
                drafted=row.drafted_total,
                draft_s=row.draft_s,
                own_accepted=getattr(row.drafter, "own_accepted", None),
            )
        self.budget.forget(rid)

    def take_stats(self, tag: str) -> RowStats | None:
        """The :class:`RowStats` of a finished request by its tag; its row is closed if still open."""
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

    def _rules(self) -> list[Rule | None] | None:
        """For the rejection sampler: None when no open request asked for the relaxed rule, else each batch
        row's ``(k, p, stale)`` or None (``stale``: its draft positions only the greedy rule may accept)."""
        if not self._relaxed_open:
            return None
        out: list[Rule | None] = []
        for rid in self.runner.input_batch.req_ids:
            row = self.rows.get(rid)
            out.append(None if row is None or row.rule is None else (*row.rule, row.stale))
        return out

    def _log_step(self, now: float, req_ids: list[str]) -> None:
        log_ = self.step_log
        if log_ is None:
            return
        if log_.last_shape is not None and log_.last_t is not None and log_.last_shape[0] == tuple(req_ids):
            lens = set(log_.last_shape[1])
            if len(lens) == 1:
                log_.times.setdefault((len(req_ids), lens.pop()), []).append(now - log_.last_t)
        log_.last_t = now
