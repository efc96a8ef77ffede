"""A request's LASER arguments: one typed record on both sides of vLLM's process boundary.

:meth:`laser.vllm.VllmEngine.submit` builds a :class:`LaserArgs` (so a misspelt or malformed argument fails
there, in the caller's process) and sends it as ``SamplingParams.extra_args["laser"]``
(:meth:`LaserArgs.to_extra_args`); the proposer, in whichever process vLLM runs it, reads it back with
:meth:`LaserArgs.from_extra_args`, which refuses another version or an unknown key with one line naming
the request. The record crosses the boundary as plain values (vLLM serialises ``extra_args`` with
msgpack when the engine core runs in another process): ``earlier`` travels as a list, and a pool key
should be a string or a number (a tuple key arrives as a list and is refused).

A team's own vLLM code gets the record with :func:`request_args`: the same arguments as one JSON text under
``"laser"``, which fits every door into ``extra_args`` (``SamplingParams(extra_args=...)``, the OpenAI
server's ``vllm_xargs``, whose values must be flat, and Ray Data LLM's per-row ``sampling_params``).

A shared server treats every value as hostile: each is bounded (:class:`Limits`, read once from the
server's environment: ``LASER_MAX_DRAFT_LEN``, ``LASER_MAX_N_MAX``, ``LASER_MAX_EARLIER``, ``LASER_MAX_TAG``),
and at admission (:func:`check_admission`) ``k`` and the ``earlier`` token ids are held to the model's
vocabulary and ``draft_len`` to the engine's ``num_speculative_tokens``, so no value reaches the engine
core that could overflow an array, index past the vocabulary or make a step's drafting unbounded.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Literal

from laser.defaults import N_MAX

VERSION = 1  # bump when a field changes meaning, name or type
EXTRA_ARGS_KEY = "laser"  # the key of SamplingParams.extra_args that holds the record
_VERSION_KEY = "v"

DraftLen = int | Literal["auto"]
INT64 = 2**63 - 1  # the largest value any integer argument may take anywhere (numpy's int64)
PATH_MAX = 4096  # characters of a pool-store path (Linux's PATH_MAX): what a server remembers per store stays small


@dataclass(frozen=True)
class Limits:
    """What one request may ask, whatever its arguments (defaults documented in docs/vllm-dropin.md; a
    server's operator sets them through the environment before vLLM starts)."""

    draft_len: int = 64  # draft tokens a step (also at most the engine's num_speculative_tokens)
    n_max: int = 32  # the longest context suffix looked up (prompt lookup and earlier text index n-grams up to it)
    earlier: int = 4096  # tokens of earlier text
    tag: int = 256  # characters of a tag, and of a string pool key

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """The limits, each overridden by ``LASER_MAX_<FIELD>`` where set (an integer >= 1)."""
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(f"LASER_MAX_{f.name.upper()}")
            if raw is not None:
                if not raw.strip().isdigit() or int(raw) < 1:
                    raise ValueError(f"LASER_MAX_{f.name.upper()} must be an integer >= 1, got {raw!r}")
                values[f.name] = int(raw)
        return cls(**values)


LIMITS = Limits.from_env()


class LaserArgsError(ValueError):
    """A request's LASER arguments are malformed, of another version, or name an unknown key."""


@dataclass(frozen=True)
class LaserArgs:
    """What one request asks of LASER's proposer.

    Attributes:
        tag: the caller's id for the request's statistics (None: vLLM's request id).
        pool: the key of the request's routed pool; None: it drafts from its own prompt and output.
        pool_store: the pool store directory the proposer opens ``pool`` from (None: a source registered
            in the proposer's process, :func:`laser.vllm.sources.register_source`).
        k, p: relaxed verification (top-``k``, probability > ``p``); both None: vLLM's own (greedy) rule.
        draft: False for a request that drafts nothing (plain decoding in a laser engine).
        draft_len: ``"auto"`` (the proposer's chain budget chooses each step) or a fixed chain length.
        earlier: the entity's earlier text (token ids), drafted before the pool (:mod:`laser.earlier`).
        n_max, min_prob: the pool's retrieval knobs (as :class:`laser.decoders.base.RetrievalDecoder`).
    """

    tag: str | None = None
    pool: Hashable | None = None
    pool_store: str | None = None
    k: int | None = None
    p: float | None = None
    draft: bool = True
    draft_len: DraftLen = "auto"
    earlier: tuple[int, ...] | None = None
    n_max: int = N_MAX
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise LaserArgsError(problem)

    def _problem(self) -> str | None:
        """One line on the first malformed field, or None."""
        if self.tag is not None and (not isinstance(self.tag, str) or len(self.tag) > LIMITS.tag):
            return f"tag must be a string of at most {LIMITS.tag} characters, got {_short(self.tag)}"
        if self.pool is not None and not _is_key(self.pool):
            return (
                f"pool must be a string of at most {LIMITS.tag} characters or an integer within int64, "
                f"got {_short(self.pool)}"
            )
        if self.pool_store is not None and (
            not isinstance(self.pool_store, str) or self.pool is None or not 0 < len(self.pool_store) <= PATH_MAX
        ):
            return (
                f"pool_store must be a directory (a string of at most {PATH_MAX} characters) beside a pool key, "
                f"got {_short(self.pool_store)}"
            )
        if (self.k is None) != (self.p is None):
            return f"k and p go together (relaxed verification), got k={_short(self.k)}, p={_short(self.p)}"
        if self.k is not None and (not _is_int(self.k) or not 1 <= self.k <= INT64):
            return f"k must be an integer >= 1 (at most the vocabulary), got {_short(self.k)}"
        if self.p is not None and not _is_prob(self.p):
            return f"p must be a probability in [0, 1], got {_short(self.p)}"
        if not isinstance(self.draft, bool):
            return f"draft must be true or false, got {_short(self.draft)}"
        if self.draft_len != "auto" and (not _is_int(self.draft_len) or not 0 <= self.draft_len <= LIMITS.draft_len):
            return f"draft_len must be 'auto' or an integer in [0, {LIMITS.draft_len}], got {_short(self.draft_len)}"
        if self.earlier is not None and (
            not isinstance(self.earlier, tuple) or not all(_is_int(t) and 0 <= t <= INT64 for t in self.earlier)
        ):
            return f"earlier must be token ids (integers >= 0), got {type(self.earlier).__name__}"
        if self.earlier is not None and len(self.earlier) > LIMITS.earlier:
            return f"earlier must be at most {LIMITS.earlier} tokens, got {len(self.earlier)}"
        if not _is_int(self.n_max) or not 1 <= self.n_max <= LIMITS.n_max:
            return f"n_max must be an integer in [1, {LIMITS.n_max}], got {_short(self.n_max)}"
        if not _is_prob(self.min_prob):
            return f"min_prob must be a probability in [0, 1], got {_short(self.min_prob)}"
        return None

    @property
    def rule(self) -> tuple[int, float] | None:
        """The relaxed rule's ``(k, p)``, or None for vLLM's own rule."""
        return None if self.k is None or self.p is None else (self.k, float(self.p))

    @property
    def fixed_len(self) -> int | None:
        """The fixed chain length the request asked for; None: the chain budget's choice."""
        return None if self.draft_len == "auto" else self.draft_len

    def to_extra_args(self) -> dict[str, dict[str, object]]:
        """``SamplingParams.extra_args`` carrying this record (with :data:`VERSION`; ``earlier`` as a list)."""
        values: dict[str, object] = {_VERSION_KEY: VERSION, **asdict(self)}
        if self.earlier is not None:
            values["earlier"] = list(self.earlier)
        return {EXTRA_ARGS_KEY: values}

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, object] | None, request_id: str) -> LaserArgs:
        """The record a request's ``extra_args`` carry; a request with none gets the defaults (it drafts
        from its own text). Raises :class:`LaserArgsError` naming ``request_id`` on another version, an
        unknown key or a malformed value."""
        raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if raw is None:
            return cls()
        if isinstance(raw, str):  # request_args' JSON form (the OpenAI server takes flat values only)
            longest = json_limit()
            if len(raw) > longest:
                raise LaserArgsError(
                    f"request {request_id}: extra_args[{EXTRA_ARGS_KEY!r}] is {len(raw)} characters, at most {longest}"
                )
            try:
                raw = json.loads(raw)
            except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nesting deeper than Python's stack
                why = str(exc) if isinstance(exc, json.JSONDecodeError) else "nested too deep"
                raise LaserArgsError(
                    f"request {request_id}: extra_args[{EXTRA_ARGS_KEY!r}] is not valid JSON ({why})"
                ) from None
        if not isinstance(raw, Mapping):
            raise LaserArgsError(
                f"request {request_id}: extra_args[{EXTRA_ARGS_KEY!r}] must be a mapping or its JSON text, "
                f"got {type(raw).__name__}"
            )
        version = raw.get(_VERSION_KEY)
        if version != VERSION:
            raise LaserArgsError(
                f"request {request_id}: LASER arguments of version {_short(version)}, this proposer "
                f"reads version {VERSION} (the engine and vLLM's processes run different code?)"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in raw if key != _VERSION_KEY and key not in known)
        if unknown:
            shown = ", ".join(_short(key, 40) for key in unknown[:5]) + (
                f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            )
            raise LaserArgsError(f"request {request_id}: unknown LASER argument(s) {shown}; known: {sorted(known)}")
        values = {str(key): value for key, value in raw.items() if key != _VERSION_KEY}
        if isinstance(values.get("earlier"), list):  # a list on the wire
            values["earlier"] = tuple(values["earlier"])
        try:
            return cls(**values)  # each value is checked in __post_init__
        except LaserArgsError as exc:
            raise LaserArgsError(f"request {request_id}: {exc}") from None


def request_args(
    pool: str | int | None = None,
    pool_store: str | None = None,
    k: int | None = None,
    p: float | None = None,
    *,
    draft: bool = True,
    draft_len: DraftLen = "auto",
    earlier: Sequence[int] | None = None,
    n_max: int = N_MAX,
    min_prob: float = 0.0,
    tag: str | None = None,
) -> dict[str, str]:
    """One request's LASER arguments for a team's own vLLM: ``SamplingParams(extra_args=request_args(...))``,
    ``extra_body={"vllm_xargs": request_args(...)}`` through the OpenAI server, or a Ray Data LLM row's
    ``sampling_params=dict(extra_args=request_args(...))``. Checked here (a malformed argument raises
    :class:`LaserArgsError` in the caller); the fields are :class:`LaserArgs`'. ``pool`` in ``pool_store``
    (a directory written by ``laser pools build`` or the job, readable where vLLM runs) is the pool the
    request drafts from; ``k`` and ``p`` ask for relaxed verification (both None: greedy, lossless)."""
    args = LaserArgs(
        tag=tag,
        pool=pool,
        pool_store=None if pool_store is None else str(pool_store),
        k=k,
        p=p,
        draft=draft,
        draft_len=draft_len,
        earlier=None if earlier is None else tuple(earlier),
        n_max=n_max,
        min_prob=min_prob,
    )
    return {EXTRA_ARGS_KEY: json.dumps(args.to_extra_args()[EXTRA_ARGS_KEY], separators=(",", ":"))}


def check_admission(
    extra_args: Mapping[str, object] | None,
    temperature: float,
    vocab: int | None = None,
    spec_tokens: int | None = None,
) -> None:
    """Refuse a request whose LASER arguments the proposer would refuse, before vLLM admits it (the plug-in
    calls this from ``SamplingParams.verify`` in vLLM's front end): an error raised in the proposer, inside
    vLLM's engine core, kills the engine for every request. Beyond the record's own checks, ``k`` and the
    ``earlier`` ids must lie within the model's ``vocab`` and ``draft_len`` within the engine's
    ``spec_tokens`` (``num_speculative_tokens``), where known. Raises :class:`LaserArgsError` (the plug-in
    raises it to vLLM as its ``VLLMValidationError``: the OpenAI server answers 400 with the line)."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return
    args = LaserArgs.from_extra_args(extra_args, "sent to vLLM")
    where = "request sent to vLLM"
    if args.rule is not None and temperature > 0:
        raise LaserArgsError(f"{where}: relaxed verification (k, p) needs temperature 0, got {temperature}")
    if vocab is not None and args.k is not None and args.k > vocab:
        raise LaserArgsError(f"{where}: k must be at most the vocabulary ({vocab}), got {_short(args.k)}")
    if vocab is not None and args.earlier and max(args.earlier) >= vocab:
        raise LaserArgsError(f"{where}: earlier holds token id {max(args.earlier)}, outside the vocabulary ({vocab})")
    if spec_tokens is not None and args.fixed_len is not None and args.fixed_len > spec_tokens:
        raise LaserArgsError(
            f"{where}: draft_len must be at most the engine's num_speculative_tokens ({spec_tokens}), "
            f"got {args.fixed_len}"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_key(value: object) -> bool:
    """A pool key a client may name: a bounded string or an int64."""
    if isinstance(value, str):
        return len(value) <= LIMITS.tag
    return _is_int(value) and -INT64 - 1 <= value <= INT64  # type: ignore[operator]


def json_limit() -> int:
    """The longest JSON text of a record: room for the longest ``earlier`` (20 characters a token id at most)
    and every other field at its limit."""
    return 20 * LIMITS.earlier + 4 * LIMITS.tag + 2 * PATH_MAX + 1024


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a client's value can be huge)."""
    text = (
        repr(value)
        if not (isinstance(value, int) and value.bit_length() > 64)
        else f"an integer of {value.bit_length()} bits"
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_prob(value: object) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0.0 <= value <= 1.0
    )
