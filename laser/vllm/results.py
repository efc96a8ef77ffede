"""What one vLLM request gave: its text and tokens with every count and time measured for it, never filled
in. Counts come from LASER's proposer (or vLLM's speculative-decoding metrics when the engine core runs
in another process), times from vLLM's own per-request timestamps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import RequestOutput

    from laser.vllm.proposer import RowStats


@dataclass
class VllmResult:
    """One request's generation: what the knowledge Parquet needs from an engine.

    Every field is measured, never filled in: where vLLM or the proposer did not measure a value it is
    None. Times are wall seconds of steps the request shared with every other request in flight.
    """

    text: str
    token_ids: list[int]
    finish_reason: str  # "eos", "length", "stop" (a stop string/token) or what the request's ``halt`` said
    prompt_tokens: int
    target_forwards: int  # target forwards that produced this request's tokens (one per step it took part in)
    accepted_tokens: int  # draft tokens among the request's tokens (its tokens minus its forwards)
    seconds: float  # wall seconds from submit to the step that returned the request finished
    # vLLM's own per-request timestamps (RequestOutput.metrics, engine-core monotonic clock):
    prefill_s: float | None = None  # first scheduled -> the step that gave its first token (prompt prefill,
    #                                 chunked or not, plus that step's share of the batch)
    decode_s: float | None = None  # first token -> last token (every later step the request was in)
    queued_s: float | None = None  # waiting in vLLM's queue before it was first scheduled
    # LASER's proposer: accepted draft tokens at each step it drafted for the request, in order (the
    # last step's may include drafts vLLM then cut at max_tokens or a stop); None where no laser
    # proposer counted (speculation other than "laser", or the proposer kept no per-step counts)
    accepted_per_step: list[int] | None = None
    drafted_tokens: int | None = None  # draft tokens the proposer gave the request in all (None: not counted)
    draft_s: float | None = None  # the proposer's seconds on the request's drafter (None: not measured)
    cached_prompt_tokens: int | None = None  # prompt tokens vLLM served from its prefix cache (None: not reported)
    own_accepted: int | None = None  # accepted drafts from the request's earlier text (None: not counted)

    @property
    def aal(self) -> float:
        """Mean accepted length: tokens per target forward."""
        return len(self.token_ids) / max(self.target_forwards, 1)


def request_result(
    out: RequestOutput,
    tokens: list[int],
    text: str,
    stats: RowStats | None,
    drafting: bool,
    prompt_tokens: int,
    seconds: float,
    halted: str | None = None,
) -> VllmResult:
    """The result of a finished request whose output gave ``tokens`` and ``text`` (cut where a halt stopped
    it: ``halted`` is the halt's reason); ``stats`` is what the proposer counted for it, ``drafting`` whether
    the engine drafts at all."""
    c = out.outputs[0]
    steps = stats.steps if stats is not None else None
    per_step = list(stats.accepted_per_step) if stats is not None else None
    drafted = stats.drafted if stats is not None else None
    if steps:  # the proposer saw every step that gave the request tokens (the prefill's first token included)
        forwards = max(1, min(steps, len(tokens)))
    elif not drafting:  # no drafts: one token per forward
        forwards, per_step, drafted = max(len(tokens), 1), [0] * len(tokens), 0
    else:  # vLLM's own drafters count nothing per request: tokens are an upper bound on forwards
        forwards = max(len(tokens), 1)
    if halted:
        reason = halted
    elif c.finish_reason == "length":
        reason = "length"
    elif c.stop_reason is None:
        reason = "eos"
    else:
        reason = "stop"
    timing = timings(out)
    return VllmResult(
        text=text,
        token_ids=tokens,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        target_forwards=forwards,
        accepted_tokens=max(len(tokens) - forwards, 0),
        seconds=seconds,
        prefill_s=timing.get("prefill_s"),
        decode_s=timing.get("decode_s"),
        queued_s=timing.get("queued_s"),
        accepted_per_step=per_step,
        drafted_tokens=drafted,
        draft_s=stats.draft_s if stats is not None else None,
        cached_prompt_tokens=getattr(out, "num_cached_tokens", None),
        own_accepted=stats.own_accepted if stats is not None else None,
    )


def timings(out: RequestOutput) -> dict[str, float]:
    """Per-request seconds from vLLM's ``RequestOutput.metrics`` (a ``RequestStateStats``, kept when the
    engine logs stats): engine-core monotonic timestamps of queueing, first scheduling, first and last
    token. Missing or unset timestamps give no entry."""
    m = getattr(out, "metrics", None)
    queued, sched = getattr(m, "queued_ts", 0.0) or 0.0, getattr(m, "scheduled_ts", 0.0) or 0.0
    first, last = getattr(m, "first_token_ts", 0.0) or 0.0, getattr(m, "last_token_ts", 0.0) or 0.0
    got: dict[str, float] = {}
    if sched and first >= sched:
        got["prefill_s"] = float(first - sched)
    if first and last >= first:
        got["decode_s"] = float(last - first)
    if queued and sched >= queued:
        got["queued_s"] = float(sched - queued)
    return got
