"""Running labd's coroutines: on uvloop where it is installed (Linux, macOS), since every
command's round trip passes through the event loop and uvloop's is several times cheaper;
on the standard loop elsewhere. Both are supported and tested.

A process that starts child processes while it talks MQTT (the agent, emulated hosts, the
failover drills) runs on the standard loop: uvloop can lose track of a file descriptor that
a child's pipe reuses (uvloop issue 414), which breaks the MQTT client's socket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, spawns: bool = False) -> T:
    """Run ``main`` to completion; ``spawns``: it starts child processes (standard loop)."""
    with asyncio.Runner(loop_factory=None if spawns else loop_factory()) as runner:
        return runner.run(main)
