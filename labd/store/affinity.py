"""The store's writer moved to the CPU the event loop queues its records from (Linux).

The loop notes the CPU it queues each record from (``sched_getcpu``); the writer, a
``SCHED_BATCH`` thread, moves there before a batch of :data:`FOLLOW_AT_LEAST` to
:data:`FOLLOW_AT_MOST` records, commits a lone record where it is, and a larger batch on
every CPU the process may use. Only the writer's own placement changes. What it gains:
docs/benchmarks.md, "Rooms around a library".
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable

__all__ = ["FOLLOW_AT_LEAST", "FOLLOW_AT_MOST", "Follower", "current_cpu"]

#: The fewest and the most records in a batch that the writer commits on the loop's CPU.
FOLLOW_AT_LEAST, FOLLOW_AT_MOST = 2, 32


def _sched_getcpu() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (the CPU the calling thread runs on); None where the C
    library has none, or the system cannot place threads."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = ctypes.c_int, []
    return function


current_cpu = _sched_getcpu()
"""The CPU the calling thread runs on now; None where it cannot be told."""


class Follower:
    """The writer thread's side: made in the writer thread, told before each batch."""

    def __init__(self) -> None:
        self.allowed: frozenset[int] = frozenset()
        self.where: frozenset[int] | None = None
        """The CPUs the writer holds itself to now (None: as it started)."""
        if current_cpu is None:
            return
        self.allowed = frozenset(os.sched_getaffinity(0))
        if len(self.allowed) < 2:
            return  # one CPU: nowhere to follow to
        # Where the system refuses (a sandbox's filter), the writer only follows.
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))

    def before(self, records: int, loop_cpu: int) -> None:
        """Before a batch of ``records``: to ``loop_cpu`` (where the loop last queued one
        from; -1: unknown) for a few, to every allowed CPU for more, nowhere for one."""
        if len(self.allowed) < 2 or records < FOLLOW_AT_LEAST:
            return
        wanted = frozenset((loop_cpu,)) if (
            records <= FOLLOW_AT_MOST and loop_cpu in self.allowed) else self.allowed
        if wanted == self.where:
            return
        try:
            os.sched_setaffinity(0, wanted)
        except OSError:  # a CPU taken away meanwhile (a cpuset changed): stay as it is
            self.allowed = frozenset()
            return
        self.where = wanted
