"""Where a lab's messages go. Every topic starts at the lab's root, ``labd/<lab>``, or, for
one instance of a lab among several on a broker, ``labd/<lab>@<instance>``: two runs of a
lab of the same name (two ``labd demo``\\ s, two CI runners) never hear each other.

Lab names cannot hold ``@`` (docs/lab-file.md), so a root names one instance unambiguously.
"""

from __future__ import annotations

import re
import secrets

from labd.errors import BusError

INSTANCE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def check_instance(instance: str) -> str:
    """``instance`` itself, if it can be one topic level's suffix; otherwise a clear error."""
    if instance and not INSTANCE.match(instance):
        raise BusError(f"MQTT instance {instance!r}: use 1 to 32 letters, digits, '-' or '_'")
    return instance


def new_instance() -> str:
    """An instance id no other run has: what ``labd demo`` and the test rigs use."""
    return secrets.token_hex(4)


def lab_root(lab: str, instance: str = "") -> str:
    """``labd/<lab>`` or ``labd/<lab>@<instance>``."""
    return f"labd/{lab}@{check_instance(instance)}" if instance else f"labd/{lab}"


def host_root(lab: str, host: str, instance: str = "") -> str:
    """Where one GPU host's agent speaks (``status``, ``heartbeat``, ``events``) and hears
    its commands (``job``)."""
    return f"{lab_root(lab, instance)}/hosts/{host}"
