"""Ground truth: every physical change an emulator made, with monotonic timestamps.

``time.monotonic_ns()`` reads CLOCK_MONOTONIC, shared by every process on the machine, so a
test can set the daemon's measurements beside these directly.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Change:
    """One physical change. Pairs and ports are kept as tuples: untracked by the garbage
    collector, so a long truth log does not lengthen its pauses (which would delay replies
    and show up as latency that is not the device's)."""

    seq: int
    emulator: str
    interface: str
    op: str
    connected: tuple[tuple[int, int], ...] = ()
    disconnected: tuple[tuple[int, int], ...] = ()
    arrived_ns: int = 0
    """When the command's last byte arrived at the emulator."""
    settled_ns: int = 0
    """When the last mirror of the batch settled (light is stable)."""
    ports: tuple[int, ...] = ()
    """Ports whose state changed (shutter, failure), for port operations."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: pairs as lists, as the control endpoint serves them."""
        data = asdict(self)
        data["connected"] = [list(p) for p in self.connected]
        data["disconnected"] = [list(p) for p in self.disconnected]
        data["ports"] = list(self.ports)
        return data


class GroundTruth:
    """A bounded log of changes; sequence numbers keep counting across resets."""

    def __init__(self, emulator: str, limit: int = 100_000) -> None:
        self.emulator = emulator
        self._seq = itertools.count(1)
        self._log: deque[Change] = deque(maxlen=limit)

    def record(self, interface: str, op: str, connected: list[tuple[int, int]],
               disconnected: list[tuple[int, int]], arrived_ns: int, settled_ns: int,
               ports: list[int] | None = None) -> Change:
        change = Change(next(self._seq), self.emulator, interface, op,
                        tuple(map(tuple, connected)), tuple(map(tuple, disconnected)),  # type: ignore[arg-type]
                        arrived_ns, settled_ns, tuple(ports or ()))
        self._log.append(change)
        return change

    def since(self, seq: int = 0) -> list[Change]:
        return [c for c in self._log if c.seq > seq]

    def clear(self) -> None:
        self._log.clear()
