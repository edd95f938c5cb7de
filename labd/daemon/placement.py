"""The daemon's event loop held on one CPU when the settings name one (``cpu``, Linux only).

Worker threads started from then on (the store's readers, ``asyncio.to_thread``) first take
back the CPUs the loop had; a process the daemon starts inherits the one CPU.
:meth:`Placement.release` gives the loop's thread back what it had (the daemon's stop calls
it). When to use it and what it gains: docs/service.md, "The event loop on one CPU".
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from labd.errors import LabdError
from labd.store.affinity import current_cpu

__all__ = ["Cpu", "Placement", "PlacementError"]

Cpu = int | Literal["auto"]
"""A CPU's number, or ``"auto"``: the one the event loop runs on as the daemon starts."""


class PlacementError(LabdError):
    """The CPU asked for cannot be had: not on this system, or not this process's."""


def _run_on(cpus: frozenset[int]) -> None:
    os.sched_setaffinity(0, cpus)


@dataclass
class Placement:
    """The event loop's thread, held on :attr:`cpu`."""

    cpu: int
    loop: int
    """The native id of the loop's thread."""
    before: frozenset[int]
    """The CPUs it could run on before."""

    @classmethod
    def pin(cls, cpu: Cpu) -> Placement:
        """Hold the calling thread (the running event loop's) on ``cpu``."""
        if current_cpu is None:
            raise PlacementError(f"cpu = {cpu!r}: placing the daemon on a CPU needs Linux; "
                                 "leave cpu unset here")
        allowed = frozenset(os.sched_getaffinity(0))
        chosen = current_cpu() if cpu == "auto" else cpu
        if chosen not in allowed:
            listed = ", ".join(str(c) for c in sorted(allowed))
            raise PlacementError(f"cpu = {cpu}: this process may run on CPUs {listed} "
                                 f"only; name one of them, or \"auto\"")
        loop = threading.get_native_id()
        os.sched_setaffinity(loop, {chosen})
        # Worker threads started from now on would inherit the one CPU: they take back the
        # loop's CPUs first. (The executor it replaces ends as its idle threads do.)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            thread_name_prefix="labd-worker", initializer=_run_on, initargs=(allowed,)))
        return cls(chosen, loop, allowed)

    def release(self) -> None:
        """Give the loop's thread back the CPUs it had."""
        os.sched_setaffinity(self.loop, self.before)
