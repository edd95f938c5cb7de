"""The bounds a lab file is held to, so that no value in it can make labd allocate, loop or
convert without end: switch sizes, port numbers, the file's size and nesting."""

from __future__ import annotations

import re
from typing import Any

#: The most ports on one side of a switch (an NxM switch may have N and M up to this; an
#: any-to-any switch this many in all). Larger than any switch labd drives.
MAX_PORTS_PER_SIDE = 4096
#: The largest port (or channel) number a fibre may name.
MAX_PORT = 2 * MAX_PORTS_PER_SIDE
#: The most bytes of a lab file (a lab with thousands of fibres is a few hundred KB).
MAX_FILE_BYTES = 4 * 1024 * 1024
#: The deepest nesting of tables and arrays (a lab file needs four).
MAX_DEPTH = 16

#: An id in a lab file (a host, a switch, an endpoint) and any name made to stand beside one
#: (an MQTT client's): safe in a file name, a topic level and a Mosquitto ACL line.
ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")

_NXM = re.compile(r"\s*([0-9]{1,9})\s*[xX]\s*([0-9]{1,9})\s*")
_COUNT = re.compile(r"\s*([0-9]{1,9})\s*")


def switch_size(text: str) -> tuple[int, int]:
    """``"16x16"`` → ``(16, 16)``; ``"320"`` (any-to-any) → ``(320, 0)``. ValueError says
    what is expected for anything else: a sign, a zero, a side beyond the bound, trailing
    words."""
    expected = (f"expected NxM with N and M whole numbers 1..{MAX_PORTS_PER_SIDE} (e.g. "
                f"'16x16'), or a port count 1..{MAX_PORTS_PER_SIDE} (e.g. '320')")
    match = _NXM.fullmatch(text) or _COUNT.fullmatch(text)
    if match is None:
        raise ValueError(f"switch size {_short(text)}: {expected}")
    sides = tuple(int(group) for group in match.groups())
    if not all(1 <= side <= MAX_PORTS_PER_SIDE for side in sides):
        raise ValueError(f"switch size {_short(text)}: {expected}")
    return (sides[0], sides[1]) if len(sides) == 2 else (sides[0], 0)


def deepest(data: Any) -> int:
    """How deeply tables and arrays nest in parsed TOML (without recursion)."""
    depth, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        depth = max(depth, level)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, level + 1) for child in children)
    return depth


def _short(text: str, limit: int = 40) -> str:
    """A value quoted for a message, cut short: a message names the value, not all of it."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"
