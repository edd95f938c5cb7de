"""The bounds a lab file is held to, so that no value in it can make labd allocate, loop or
convert without end: port numbers, the file's size and nesting (switch sizes are the
drivers' ``instruments.switch.parse_size``, strict and bounded)."""

from __future__ import annotations

import re
from typing import Any

# The most ports on one side of a switch is the drivers' bound: they parse sizes too
# (``parse_size``: one parser for the lab file and the drivers).
from instruments.switch import MAX_PORTS_PER_SIDE

__all__ = ["ID", "MAX_DEPTH", "MAX_FILE_BYTES", "MAX_PORT", "MAX_PORTS_PER_SIDE", "deepest"]

#: The largest port (or channel) number a fibre may name.
MAX_PORT = 2 * MAX_PORTS_PER_SIDE
#: The most bytes of a lab file (a lab with thousands of fibres is a few hundred KB).
MAX_FILE_BYTES = 4 * 1024 * 1024
#: The deepest nesting of tables and arrays (a lab file needs four).
MAX_DEPTH = 16

#: An id in a lab file (a host, a switch, an endpoint) and any name made to stand beside one
#: (an MQTT client's): safe in a file name, a topic level and a Mosquitto ACL line.
ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


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
