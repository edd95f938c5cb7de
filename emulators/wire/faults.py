"""Fault injection shared by every emulator interface.

Kinds (set through the control endpoint):

* ``drop``: close the connection on the next ``count`` commands (``apply`` decides whether
  the device carries the command out first: a cut *mid-command*); ``now`` closes every open
  connection at once.
* ``stall``: read commands but never answer or act (hung firmware) for ``count`` commands,
  or until cleared.
* ``garbage``: carry the command out, but replace the reply with noise.
* ``delay``: hold each reply back ``delay_ms`` longer.
* ``fail_port`` / ``restore_port``: a port's state goes to failed (light lost) and back.
* ``no_sensor``, ``saturation``, ``stuck``: a power-meter channel (``channel``, or all)
  loses its head, reads over-range, or repeats its last value.
* ``dead_heater`` / ``revive_heater``: a mesh heater (``channel``) stops heating (its MZI
  stays in the cross state whatever voltage it gets) and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAULT_KINDS = ("drop", "stall", "garbage", "delay", "fail_port", "restore_port",
               "no_sensor", "saturation", "stuck", "dead_heater", "revive_heater")
#: Faults of a meter channel (``channel``; all channels when absent), not of the link.
METER_FAULT_KINDS = ("no_sensor", "saturation", "stuck")


class FaultError(ValueError):
    """A fault request that cannot be applied; the message says why."""


@dataclass
class Fault:
    kind: str
    remaining: int | None = 1
    """Commands (or replies) still to affect; None = until cleared."""
    delay_ms: float = 0.0
    apply: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "remaining": self.remaining, "delay_ms": self.delay_ms,
                "apply": self.apply}


@dataclass
class Faults:
    active: list[Fault] = field(default_factory=list)

    def add(self, fault: Fault) -> None:
        self.active = [f for f in self.active if f.kind != fault.kind]
        self.active.append(fault)

    def clear(self) -> None:
        self.active.clear()

    def take(self, kind: str) -> Fault | None:
        """The active fault of this kind, counting one use of it."""
        for fault in self.active:
            if fault.kind == kind:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self.active.remove(fault)
                return fault
        return None

    def peek(self, kind: str) -> Fault | None:
        return next((f for f in self.active if f.kind == kind), None)


def parse_fault(body: dict[str, Any]) -> Fault:
    kind = body.get("kind")
    if kind not in FAULT_KINDS:
        raise FaultError(f"fault kind {kind!r} unknown; expected one of {', '.join(FAULT_KINDS)}")
    count = body.get("count", 1 if kind in ("drop", "garbage") else None)
    if count is not None and (not isinstance(count, int) or count < 1):
        raise FaultError(f"count must be a positive whole number or null, got {count!r}")
    delay = body.get("delay_ms", 0.0)
    if not isinstance(delay, int | float) or delay < 0:
        raise FaultError(f"delay_ms must be a number ≥ 0, got {delay!r}")
    if kind == "delay" and not delay:
        raise FaultError("a delay fault needs delay_ms > 0")
    return Fault(kind, count, float(delay), bool(body.get("apply", False)))
