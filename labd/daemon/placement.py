"""Where the daemon's event loop and its store's writer run: on one CPU, when the settings
name one (``cpu``, Linux only).

The two hand each other every durable record: the loop queues it and wakes the writer, the
writer commits it and wakes the loop, and each takes the interpreter's lock from the other
several times a batch. Left to the kernel they land on one CPU in some runs and on two in
others; on two, every hand-over wakes the other CPU and moves the lock and the record's
memory across, and 8 emulated switches ran 6,000-7,000 reconfigurations a second where on
one they ran 8,300-9,000 (docs/benchmarks.md, "The loop and the writer on one CPU"). On one
CPU the writer commits in the loop's idle time, and a hand-over is a switch on that CPU. The
writer is made a batch thread there too (``SCHED_BATCH``): woken by the loop, it no longer
cuts in but runs when the loop waits, with whatever has queued by then (9,400-9,800 a
second).

A thread inherits the CPUs of the thread that starts it, so the loop's worker threads (the
store's readers, ``asyncio.to_thread``) are started from here on by an executor whose threads
first take back the CPUs the loop had: a long read runs beside the loop, not in its time.
A process the daemon starts still inherits the one CPU. Two daemons on ``auto`` may land on
the same CPU, which is why it is a setting, not the default; :meth:`Placement.release`
gives both threads back what they had (the daemon's stop calls it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from labd.errors import LabdError

__all__ = ["Cpu", "Placement", "PlacementError", "current_cpu"]

Cpu = int | Literal["auto"]
"""A CPU's number, or ``"auto"``: the one the event loop runs on as the daemon starts."""


class PlacementError(LabdError):
    """The CPU asked for cannot be had: not on this system, or not this process's."""


def _run_on(cpus: frozenset[int]) -> None:
    os.sched_setaffinity(0, cpus)


def current_cpu() -> int:
    """The CPU the calling thread runs on now (Linux: /proc/thread-self/stat, field 39)."""
    with open("/proc/thread-self/stat") as stat:
        # After the command's name, which may hold spaces and parentheses: field 3 onwards.
        return int(stat.read().rsplit(")", 1)[1].split()[36])


@dataclass
class Placement:
    """The event loop's thread and the writer's, held on :attr:`cpu`."""

    cpu: int
    loop: int
    writer: int
    """The native ids of the two threads placed."""
    before: frozenset[int]
    """The CPUs the loop's thread could run on before."""

    @classmethod
    def pin(cls, cpu: Cpu, writer: int) -> Placement:
        """Hold the calling thread (the running event loop's) and the thread ``writer`` (a
        native thread id: the store's writer) on ``cpu``."""
        if not hasattr(os, "sched_setaffinity"):
            raise PlacementError(f"cpu = {cpu!r}: placing the daemon's threads on a CPU "
                                 "needs Linux; leave cpu unset here")
        allowed = frozenset(os.sched_getaffinity(0))
        chosen = current_cpu() if cpu == "auto" else cpu
        if chosen not in allowed:
            listed = ", ".join(str(c) for c in sorted(allowed))
            raise PlacementError(f"cpu = {cpu}: this process may run on CPUs {listed} "
                                 f"only; name one of them, or \"auto\"")
        loop = threading.get_native_id()
        os.sched_setaffinity(loop, {chosen})
        try:
            os.sched_setaffinity(writer, {chosen})
        except OSError as exc:  # the writer has ended (a store closed meanwhile)
            os.sched_setaffinity(loop, allowed)
            raise PlacementError(f"cpu = {cpu}: the store's writer cannot be placed: "
                                 f"{exc.strerror or exc}") from None
        # Worker threads started from now on would inherit the one CPU: they take back the
        # loop's CPUs first. (The executor it replaces ends as its idle threads do.)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            thread_name_prefix="labd-worker", initializer=_run_on, initargs=(allowed,)))
        # The writer as a batch thread: woken by the loop, it waits for the loop's turn to
        # end rather than cutting in, and finds more records queued when it runs. Where the
        # system refuses (a sandbox's filter), the placement stands without it.
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(writer, os.SCHED_BATCH, os.sched_param(0))
        return cls(chosen, loop, writer, allowed)

    def release(self) -> None:
        """Give both threads back the CPUs the loop's had, the writer its usual scheduling
        (where it still runs: it ends with its store)."""
        os.sched_setaffinity(self.loop, self.before)
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(self.writer, self.before)
            os.sched_setscheduler(self.writer, os.SCHED_OTHER, os.sched_param(0))
