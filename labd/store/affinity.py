"""The store's writer runs where the event loop runs (Linux).

Every acknowledged change waits for its durable record, which passes twice between two
threads: the event loop queues it and wakes the writer, the writer commits it and wakes the
loop, and each takes the interpreter's lock from the other on the way. Left to the kernel,
the two ran on one CPU in some minutes and on two in others; on two, every hand-over wakes
the other CPU and carries the lock and the record's memory across. 8 emulated switches ran
6,000-7,000 reconfigurations a second so, and 7,300-9,200 with the writer following the
loop as below (docs/benchmarks.md, "The loop and the writer on one CPU").

So the loop notes the CPU it queues each record from (``sched_getcpu``, 0.1 µs), and the
writer, before a batch of a few records, moves to that CPU; it runs there as a batch thread
(``SCHED_BATCH``): woken by the loop, it does not cut in, but runs when the loop waits, with
whatever has queued by then. Without that, a writer woken beside the loop pushed the loop to
the other CPU, and the writer chased it there (a thousand moves in five seconds; no gain).
A lone record is no stream to follow: the writer commits it where it is (a loop that waits
between requests wakes on any CPU, and a move for each cost the API's path more than it
saved). A large batch (more than :data:`FOLLOW_AT_MOST` records: a burst, a backlog) is
throughput, not a waiting request: the writer takes every CPU the process may use for it,
beside the loop.

Only the writer's own placement changes: the loop, and every thread or process it starts,
stay where the kernel and the administrator put them.
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
