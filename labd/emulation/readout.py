"""What the demo prints beside its tables: how loaded the machine was while the figures
were taken, and plain progress lines where no terminal shows a progress bar.

The demo's figures are the daemon's own time on this machine's CPUs: on a machine busy
with something else they swing between runs (a p99 of 17.7 ms in one, 0.43 ms in the next,
measured on the same lab), so the report says how busy it was. Load is the load average
per CPU over the run and, on a virtual machine, the share of CPU time the hypervisor took
(steal, from ``/proc/stat``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import Progress, TaskID

__all__ = ["LOADED_PER_CPU", "LOADED_STEAL", "Load", "PlainProgress", "progress_for"]

#: At or above this load average per CPU, or this share of stolen time, the machine is
#: called loaded: the daemon's loop then waits for a CPU often enough to show in a p99.
LOADED_PER_CPU = 0.7
LOADED_STEAL = 0.05


def _cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(all CPU time, stolen time) in ticks since boot; None where /proc/stat is not."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[7]


@dataclass
class Load:
    """The machine's load over a stretch of time (:meth:`start`, then :meth:`stop`)."""

    cpus: int
    load_average: float | None = None
    """The 1-minute load average at the end (None where the system keeps none)."""
    steal: float | None = None
    """The share of CPU time stolen by the hypervisor meanwhile (None: not known)."""
    _begun: tuple[int, int] | None = None

    @classmethod
    def start(cls) -> Load:
        return cls(cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1, _begun=_cpu_times())

    def stop(self) -> Load:
        try:
            self.load_average = os.getloadavg()[0]
        except OSError:
            self.load_average = None
        ended = _cpu_times()
        if self._begun is not None and ended is not None:
            ticks = ended[0] - self._begun[0]
            self.steal = (ended[1] - self._begun[1]) / ticks if ticks > 0 else 0.0
        return self

    @property
    def loaded(self) -> bool:
        per_cpu = (self.load_average or 0.0) / self.cpus
        return per_cpu >= LOADED_PER_CPU or (self.steal or 0.0) >= LOADED_STEAL

    def note(self) -> str:
        """One line: the load, and what it means for the figures where it is high."""
        parts = []
        if self.load_average is not None:
            parts.append(f"load average {self.load_average:.2f} on {self.cpus} CPU"
                         + ("s" if self.cpus != 1 else ""))
        if self.steal is not None:
            parts.append(f"CPU steal {self.steal:.0%}")
        said = "During the run: " + (", ".join(parts) or "load not known")
        if self.loaded:
            said += " (loaded: labd's own times, p99 most, run slower and vary between runs)"
        return said


class PlainProgress:
    """rich's Progress as plain lines, for output that is no terminal (a CI log, a pipe):
    a line as each task starts, at each quarter, and as it ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._tasks: dict[int, list[Any]] = {}  # id -> [description, total, done, began]

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        return None

    def add_task(self, description: str, total: float | None = None) -> TaskID:
        task = TaskID(len(self._tasks))
        self._tasks[task] = [description, total or 0, 0, time.monotonic()]
        self.console.print(f"{description}: started ({total:g} to do)" if total
                           else f"{description}: started", highlight=False)
        return task

    def advance(self, task: TaskID, advance: float = 1) -> None:
        entry = self._tasks[task]
        description, total, before, began = entry
        entry[2] = done = before + advance
        if not total:
            return
        if done >= total > before:
            self.console.print(f"{description}: done, {total:g} in "
                               f"{time.monotonic() - began:.1f} s", highlight=False)
        elif int(4 * done / total) > int(4 * before / total):
            self.console.print(f"{description}: {done:g}/{total:g}", highlight=False)


def progress_for(console: Console) -> Progress | PlainProgress:
    """A progress bar on a terminal; plain lines elsewhere (a bar is not drawn there)."""
    if console.is_terminal:
        return Progress(console=console, transient=True)
    return PlainProgress(console)
