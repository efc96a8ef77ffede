"""The output's run lock, re-exported: it lives in :mod:`pipelines.lock` (storage level), so that the
knowledge job itself can take it without importing the operations layer."""
from __future__ import annotations

from pipelines.lock import LEASE_S, LOCK_FILE, LockError, LockHeld, LockLost, RunLock, check_held, output_lock  # noqa: F401
