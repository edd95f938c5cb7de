"""Numbers and lines as a device reads them off the wire: bounded before they are converted,
so a client's 5,000-digit number, ``inf`` or ``nan`` is a refused command, never a Python
error in a session (which would end it) and never a value the device model cannot hold."""

from __future__ import annotations

import math
import re

#: Longest number a device reads, sign, point and exponent included (a float has 17
#: significant digits; a port number a few).
MAX_NUMBER_CHARS = 32
#: Longest message a session takes: a longer one is refused whole as a protocol error and
#: its bytes are dropped up to the next separator.
MAX_MESSAGE_BYTES = 64 * 1024

_INT = re.compile(r"[+-]?\d+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def wire_int(text: str) -> int:
    """A decimal integer of at most :data:`MAX_NUMBER_CHARS` characters (surrounding blanks
    allowed). Raises ValueError otherwise."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _INT.fullmatch(text):
        raise ValueError(f"not a whole number of at most {MAX_NUMBER_CHARS} characters")
    return int(text)


def wire_float(text: str) -> float:
    """A finite decimal number of at most :data:`MAX_NUMBER_CHARS` characters: no ``inf``,
    ``nan``, ``1e999`` or hex. Raises ValueError otherwise."""
    text = text.strip()
    if len(text) > MAX_NUMBER_CHARS or not _FLOAT.fullmatch(text):
        raise ValueError(f"not a number of at most {MAX_NUMBER_CHARS} characters")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def shown(text: str, limit: int) -> str:
    """Client text in an error: printable ASCII (``ascii``), cut short at ``limit``, so
    that an error entry or a DENY comment stays small whatever was sent."""
    quoted = ascii(text)
    return quoted if len(quoted) <= limit else quoted[:limit] + "...'"
