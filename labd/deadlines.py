"""How long a step waits for another process or for the daemon to get somewhere: an
emulator process to print its ready line, hosts to come online, a job to take its first
step, a recovery to end. Each of these waits on evidence (a line, an event, a state); the
deadline is only how long the evidence may take before the step gives up with a message
that says what it was waiting for.

The defaults are generous, since a loaded machine (a busy CI runner, a laptop compiling)
is slow for every process at once; ``--deadline-scale`` and ``$LABD_DEADLINE_SCALE``
multiply them all. A run sets them once with :func:`use` (the commands do, from their
options); everything else reads :func:`current`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Literal

from labd.errors import LabdError

#: The environment variable that multiplies every deadline (CI on a shared machine).
SCALE_ENV = "LABD_DEADLINE_SCALE"
#: The waits a deadline is kept for (the fields of :class:`Deadlines`).
Wait = Literal["process_ready", "hosts_online", "first_step", "recovery", "resync",
               "control_call"]
#: Beyond this a typo (1000 for 10) would leave a stuck run waiting for days.
MAX_SCALE = 100.0


@dataclass(frozen=True)
class Deadlines:
    """Seconds each kind of wait may take, before ``scale`` multiplies them."""

    process_ready: float = 120.0
    """A process labd starts (``labd emulate``) to print its ready line."""
    hosts_online: float = 120.0
    """Every emulated host online and reporting healthy GPUs (after a start or a repair)."""
    first_step: float = 180.0
    """A job's ranks to start and take their first step (a new epoch's processes)."""
    recovery: float = 180.0
    """A failover to reach its end (detected, spare chosen, rewired, job restarted)."""
    resync: float = 60.0
    """A driver to reconnect and resynchronise after its link was cut."""
    control_call: float = 60.0
    """One request to the emulators' control endpoint (it may be another, busy, process)."""
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and 0 < self.scale <= MAX_SCALE):
            raise LabdError(f"deadline scale {self.scale!r}: expected a number above 0 and "
                            f"at most {MAX_SCALE:g} (1 is the default; 3 on a loaded machine)")

    def of(self, wait: Wait) -> float:
        """The deadline for ``wait`` (a field's name), scaled, in seconds."""
        base: float = getattr(self, wait)
        return base * self.scale

    def times(self, seconds: float) -> float:
        """Any other wait of ``seconds`` on this run's scale (a test's own limits)."""
        return seconds * self.scale

    @classmethod
    def from_env(cls, scale: float | None = None) -> Deadlines:
        """The defaults scaled by ``scale`` if given, else by ``$LABD_DEADLINE_SCALE``."""
        if scale is None:
            raw = os.environ.get(SCALE_ENV, "").strip()
            if raw:
                try:
                    scale = float(raw)
                except ValueError:
                    raise LabdError(f"{SCALE_ENV}={raw[:40]!r}: expected a number such as "
                                    "3 (every deadline times 3)") from None
        return cls() if scale is None else cls(scale=scale)

    def summary(self) -> str:
        return ", ".join(f"{f.name} {getattr(self, f.name) * self.scale:g} s"
                         for f in fields(self) if f.name != "scale")


_current: Deadlines | None = None


def current() -> Deadlines:
    """The deadlines of this run: those given to :func:`use`, else the defaults scaled by
    ``$LABD_DEADLINE_SCALE``."""
    return _current if _current is not None else Deadlines.from_env()


def use(deadlines: Deadlines | None) -> None:
    """Set this process's deadlines (None: back to the defaults and the environment)."""
    global _current
    _current = deadlines


def timed_out(seconds: float, what: str) -> str:
    """What to say when a wait ran past its deadline."""
    return (f"timed out after {seconds:g} s waiting for {what}; on a loaded machine give "
            f"it more time with --deadline-scale or {SCALE_ENV} (e.g. 3)")
