"""Numbers in device replies, read the one bounded way: a reply that is not a plain, short,
finite number (5,000 digits, ``inf``, ``nan``, ``0x10``, garbage, nothing) is a
:class:`ProtocolError` that names the instrument and the command, never a raw ValueError or
OverflowError from deep in a driver."""

from __future__ import annotations

import math
import re

from instruments.errors import ProtocolError

#: Longest number a driver reads from a reply, sign, point and exponent included.
MAX_NUMBER_CHARS = 32

_INT = re.compile(r"[+-]?\d+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def shown(text: str, limit: int = 80) -> str:
    """Device text in a message: printable ASCII (``ascii``), cut short at ``limit``."""
    quoted = ascii(text)
    return quoted if len(quoted) <= limit else quoted[:limit] + "...'"


def _refused(text: str, what: str, command: str, instrument: str | None) -> ProtocolError:
    return ProtocolError(f"{command!r} answered {shown(text)}, expected {what} of at most "
                         f"{MAX_NUMBER_CHARS} characters", instrument=instrument)


def reply_int(text: str, command: str, instrument: str | None = None, *,
              what: str = "a whole number") -> int:
    """``text`` (blanks around it allowed) as an int; ProtocolError otherwise."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _INT.fullmatch(stripped):
        raise _refused(text, what, command, instrument)
    return int(stripped)


def reply_float(text: str, command: str, instrument: str | None = None, *,
                what: str = "a number") -> float:
    """``text`` (blanks around it allowed) as a finite float; ProtocolError otherwise.
    Devices flag over-range with a large finite sentinel, never with ``inf``."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _FLOAT.fullmatch(stripped):
        raise _refused(text, what, command, instrument)
    value = float(stripped)
    if not math.isfinite(value):
        raise _refused(text, what, command, instrument)
    return value
