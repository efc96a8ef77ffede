"""SIGINT/SIGTERM during a job: stop cleanly instead of dying mid-shard.

Inside :func:`catch_signals` either signal raises :class:`JobInterrupted` in the main thread. It unwinds
like any error: ``KnowledgeWriter`` context managers flush the rows already generated as a last shard
and the generation actors are killed. The CLI then reports what was kept and exits ``128 + signal``
(130 for SIGINT, 143 for SIGTERM). A second signal while stopping is ignored, so the flush completes.
``ray.init`` installs its own SIGTERM handler; :func:`reassert` puts ours back after it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ray import ObjectRef

T = TypeVar("T")

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active = False
_stopping = False


class JobInterrupted(BaseException):
    """Raised by the signal handler; a BaseException so that ``except Exception`` blocks let it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum: int, frame: FrameType | None) -> None:
    global _stopping
    if _stopping:
        log.warning("%s received while stopping; still flushing", signal.Signals(signum).name)
        return
    _stopping = True
    raise JobInterrupted(signum)


def _install() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def reassert() -> None:
    """Re-install the handlers when :func:`catch_signals` is active (after a library replaced them)."""
    if _active and threading.current_thread() is threading.main_thread():
        _install()


def ray_wait(refs: list[ObjectRef[T]], timeout: float = 0.5) -> tuple[list[ObjectRef[T]], list[ObjectRef[T]]]:
    """``ray.wait`` that lets a signal's :class:`JobInterrupted` through: raised by the handler while Ray's
        compiled wait is running, it comes out wrapped in a ``SystemError`` ("returned a result with an
        exception set"), which would otherwise unwind as an ordinary error. Returns the first ready ref (or none
    after ``timeout`` seconds: short, so that signals get handled) and the others."""
    import ray

    try:
        return ray.wait(refs, num_returns=1, timeout=timeout)
    except SystemError as exc:
        inner = exc.__cause__ or exc.__context__
        if isinstance(inner, JobInterrupted):
            raise inner from None
        raise


@contextmanager
def catch_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`JobInterrupted` inside the block (main thread only)."""
    global _active, _stopping
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _active, _stopping = True, False
    _install()
    try:
        yield
    finally:
        _active = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)
