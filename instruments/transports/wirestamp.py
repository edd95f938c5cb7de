"""When bytes reached the socket, as the kernel saw it.

A reply's arrival stamped when the daemon's event loop gets round to reading it includes
however long the process waited for a CPU: on a busy or virtualised machine, a millisecond
now and then, which is then reported as the device's time. The kernel stamps each received
segment (``SO_TIMESTAMPNS``) as it lands, whoever is running; the stamp comes with the data
from ``recvmsg``. It is CLOCK_REALTIME, and labd times in CLOCK_MONOTONIC, so it is moved
across by the clocks' offset.

The two clocks run at one rate (NTP slews both alike); their offset moves only when the wall
clock is stepped. So it is measured once, tightly, and kept: each stamp then costs one
reading of each clock, which shows a step (a difference beyond :data:`STEP_NS`) and has the
offset measured again. Measuring it for every reply cost a microsecond a reply and was off
by half of whatever interrupted the readings.
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time

#: SO_TIMESTAMPNS (and its control message, SCM_TIMESTAMPNS) where the value is known to be
#: the generic one; elsewhere arrivals are stamped when read.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_KNOWN = sys.platform == "linux" and platform.machine() in (
    "x86_64", "aarch64", "i686", "armv7l", "riscv64", "s390x", "ppc64le")
_TIMESPEC = struct.Struct("@qq")
#: A stamp older than this means the wall clock was stepped in between.
_PLAUSIBLE_NS = 10_000_000_000
ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what ``sock`` receives; False where it cannot."""
    if not _KNOWN:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


#: Readings of the two clocks further apart than this were interrupted: read them again.
_TIGHT_NS = 2_000


def realtime_to_monotonic(tries: int = 5) -> tuple[int, int]:
    """(CLOCK_MONOTONIC - CLOCK_REALTIME in ns, the monotonic time now), from readings
    taken back to back. A process can lose the CPU between two readings (on a virtual
    machine, for tens of µs a few hundred times a second), which would put the offset off
    by half that: the tightest of a few tries is kept."""
    best: tuple[int, int, int] | None = None  # (gap, offset, now)
    for _ in range(tries):
        before = time.monotonic_ns()
        wall = time.time_ns()
        now = time.monotonic_ns()
        gap = now - before
        if best is None or gap < best[0]:
            best = (gap, (before + now) // 2 - wall, now)
        if gap <= _TIGHT_NS:
            break
    assert best is not None
    return best[1], best[2]


#: A change of the clocks' offset beyond this is a step of the wall clock: measure again.
#: (Two back-to-back readings differ by well under it unless the process lost the CPU
#: between them, which a tight measurement then tells apart from a step.)
STEP_NS = 50_000
#: Tries for the measurement that is kept (the tightest pair of readings wins).
KEPT_TRIES = 50

_offset: int | None = None
"""CLOCK_MONOTONIC - CLOCK_REALTIME (ns), as last measured tightly."""


def clock_offset() -> tuple[int, int]:
    """(the clocks' offset, the monotonic time now): the kept offset, measured again when
    the clocks' readings now say the wall clock was stepped."""
    global _offset
    now = time.monotonic_ns()
    rough = now - time.time_ns()
    if _offset is None or abs(rough - _offset) > STEP_NS:
        _offset, now = realtime_to_monotonic(KEPT_TRIES)
    return _offset, now


def arrival_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The monotonic time the received bytes landed (now, where the kernel gave no stamp
    or the clocks were stepped since)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            offset, now = clock_offset()
            landed = seconds * 1_000_000_000 + nanoseconds + offset
            return landed if 0 <= now - landed < _PLAUSIBLE_NS else now
    return time.monotonic_ns()
