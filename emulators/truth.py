"""Ground truth: every physical change an emulator made, with monotonic timestamps.

``time.monotonic_ns()`` reads CLOCK_MONOTONIC, shared by every process on the machine, so a
test can set the daemon's measurements beside these directly.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Change:
    seq: int
    emulator: str
    interface: str
    op: str
    connected: list[tuple[int, int]] = field(default_factory=list)
    disconnected: list[tuple[int, int]] = field(default_factory=list)
    arrived_ns: int = 0
    """When the command's last byte arrived at the emulator."""
    settled_ns: int = 0
    """When the last mirror of the batch settled (light is stable)."""
    ports: list[int] = field(default_factory=list)
    """Ports whose state changed (shutter, failure), for port operations."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: pairs as lists, as the control endpoint serves them."""
        data = asdict(self)
        data["connected"] = [list(p) for p in self.connected]
        data["disconnected"] = [list(p) for p in self.disconnected]
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
        change = Change(next(self._seq), self.emulator, interface, op, connected, disconnected,
                        arrived_ns, settled_ns, ports or [])
        self._log.append(change)
        return change

    def since(self, seq: int = 0) -> list[Change]:
        return [c for c in self._log if c.seq > seq]

    def clear(self) -> None:
        self._log.clear()
