"""Where a run's wall time went: one account per run, in ``summary.json`` and the closing table.

The driver times its own phases (load, route, plan, pools, waiting for the workers, writing, the latest
view). The generation pass's remaining wall is the engine's: it is split into prefill, first decode and
retries in proportion to the engine's own clock (steps with a prompt in them; decode-only steps, shared
between first texts and retries by their decoded tokens), and what the engine clock does not cover (pool
loads, prompt building, scheduling, actors idle) is ``generation other``. The phases add up to the wall.

``fixed`` is everything but prefill and decode: what a run pays whatever it generates.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

# in the order a run meets them; "other": the lock, stores, ledger and summary, what no phase timed
PHASES = (
    "load",
    "old knowledge",
    "route",
    "plan",
    "pools",
    "startup",
    "prefill",
    "first decode",
    "retries",
    "generation other",
    "writing",
    "latest view",
    "other",
)
GENERATION = ("prefill", "first decode", "retries")  # the engine's work on the texts; the rest is fixed


@dataclass(frozen=True)
class EngineTime:
    """What a generation pass's engines and driver measured (``GenerationReport``'s figures): the pass's
    wall, the driver's waits for the workers and its writing, and the engines' clocks."""

    wall_s: float
    startup_s: float  # the driver blocked on Ray, actor start, model load and engine start
    writing_s: float  # the driver writing rows and failures
    busy_s: float  # engine seconds, every step, summed over actors
    decode_s: float  # of them, steps in which no request prefilled
    retry_share: float  # retried texts' share of the decoded tokens
    actors: int  # actors that worked in parallel


@dataclass
class TimeAccount:
    """Seconds per phase of one run (:data:`PHASES`), adding up to ``wall_s``."""

    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    engine_ready_s: float = 0.0  # the slowest actor's engine start, measured in the actor (overlapped or not)
    _start: float = field(default_factory=time.perf_counter, repr=False)
    _inner: float = field(default=0.0, repr=False)  # seconds of phases nested in the one being timed

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block into ``name``; a phase timed inside it is taken out of it (no second count)."""
        t0, inner = time.perf_counter(), self._inner
        self._inner = 0.0
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.add(name, took - self._inner)
            self._inner = inner + took

    def add(self, name: str, seconds: float) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; one of {', '.join(PHASES)}")
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)

    def generation(self, eng: EngineTime, phase: str | None = None) -> None:
        """Account a generation pass: split into startup, writing, the engine's work (prefill, first decode,
        retries) and generation other; or, for a pass already timed whole as ``phase`` (old knowledge), only
        its wait for the workers' start moved out of ``phase`` into startup."""
        if phase is not None:
            self.seconds[phase] = max(0.0, self.seconds.get(phase, 0.0) - eng.startup_s)
            self.add("startup", eng.startup_s)
            return
        self.add("startup", eng.startup_s)
        self.add("writing", eng.writing_s)
        rest = max(0.0, eng.wall_s - eng.startup_s - eng.writing_s)
        engine = min(rest, eng.busy_s / max(1, eng.actors))  # actors work side by side
        scale = engine / eng.busy_s if eng.busy_s else 0.0
        decode = eng.decode_s * scale
        self.add("prefill", (eng.busy_s - eng.decode_s) * scale)
        self.add("first decode", decode * (1.0 - eng.retry_share))
        self.add("retries", decode * eng.retry_share)
        self.add("generation other", rest - engine)

    def close(self) -> "TimeAccount":
        """The wall so far; what no phase timed becomes ``other``."""
        self.wall_s = time.perf_counter() - self._start
        timed = sum(v for k, v in self.seconds.items() if k != "other")
        self.seconds["other"] = max(0.0, self.wall_s - timed)
        return self

    @property
    def fixed_s(self) -> float:
        """Everything but prefill and decode."""
        return self.wall_s - sum(self.seconds.get(k, 0.0) for k in GENERATION)

    def ordered(self) -> list[tuple[str, float]]:
        """The phases with time in them, in :data:`PHASES` order."""
        return [(k, self.seconds[k]) for k in PHASES if self.seconds.get(k, 0.0) > 0.0]

    def to_json(self) -> dict[str, object]:
        return {
            "wall_s": round(self.wall_s, 3),
            "fixed_s": round(self.fixed_s, 3),
            "engine_ready_s": round(self.engine_ready_s, 3),
            "seconds": {k: round(v, 3) for k, v in self.ordered()},
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> "TimeAccount":
        seconds = data.get("seconds") or {}
        if not isinstance(seconds, dict):
            raise ValueError(f"time account: 'seconds' is {type(seconds).__name__}, not an object")
        return cls(
            seconds={str(k): float(v) for k, v in seconds.items()},
            wall_s=float(data.get("wall_s") or 0.0),  # type: ignore[arg-type]
            engine_ready_s=float(data.get("engine_ready_s") or 0.0),  # type: ignore[arg-type]
        )

    def line(self) -> str:
        """One line: each phase's seconds and share of the wall."""
        wall = self.wall_s or 1.0
        parts = [f"{k} {v:.1f}s ({v / wall:.0%})" for k, v in self.ordered()]
        return f"wall {self.wall_s:.1f}s, fixed {self.fixed_s:.1f}s: " + ", ".join(parts)
