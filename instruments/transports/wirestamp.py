"""When bytes reached the socket, as the kernel saw it.

A reply's arrival stamped when the daemon's event loop gets round to reading it includes
however long the process waited for a CPU: on a busy or virtualised machine, a millisecond
now and then, which is then reported as the device's time. The kernel stamps each received
segment (``SO_TIMESTAMPNS``) as it lands, whoever is running; the stamp comes with the data
from ``recvmsg``. It is CLOCK_REALTIME, and labd times in CLOCK_MONOTONIC, so it is moved
across by the clocks' offset, read at the same moment.
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


def arrival_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The monotonic time the received bytes landed (now, where the kernel gave no stamp
    or the clocks were stepped since)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            offset, now = realtime_to_monotonic()
            landed = seconds * 1_000_000_000 + nanoseconds + offset
            return landed if 0 <= now - landed < _PLAUSIBLE_NS else now
    return time.monotonic_ns()
