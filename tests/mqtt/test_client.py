"""The MQTT client every part of labd uses (labd.mqtt.client): a write watch asked for on a
socket that closes before the loop gets to it is no ERROR in the logs, on the standard loop
and on uvloop (what ``labd run`` runs on): the race a publish into a broker that just died
runs into."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest

from labd.mqtt.client import _Client, backoff

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
    uvloop = None

LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
if uvloop is not None:
    LOOPS.append(uvloop.new_event_loop)


class Paho:
    """paho's side as the watch sees it: what it writes when the socket may be written."""

    def __init__(self) -> None:
        self.writes = 0

    def loop_write(self) -> int:
        self.writes += 1
        return 0


@pytest.mark.parametrize("new_loop", LOOPS, ids=lambda f: f.__module__.split(".")[0])
def test_a_write_watch_on_a_socket_closed_meanwhile_is_no_error(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    loop = new_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))

    async def race() -> tuple[int, bool]:
        client = _Client("127.0.0.1", 1)
        paho = Paho()
        closed, kept = socket.socketpair()
        open_a, open_b = socket.socketpair()
        with kept, open_b, open_a:
            client._on_socket_register_write(paho, None, closed)
            closed.close()  # before the loop runs the watch
            client._on_socket_register_write(paho, None, open_a)
            for _ in range(5):
                await asyncio.sleep(0)
            loop.remove_writer(open_a.fileno())
            return paho.writes, client._disconnected.done()

    try:
        writes, ended = loop.run_until_complete(race())
    finally:
        loop.close()
    assert errors == []
    assert writes >= 1  # the open socket was watched, and written when it could be
    assert not ended


def test_the_backoff_doubles_to_its_ceiling_each_wait_from_its_upper_half() -> None:
    for tries, ceiling in ((0, 0.1), (1, 0.2), (3, 0.8), (6, 5.0), (60, 5.0)):
        waits = [backoff(tries) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (tries, min(waits), max(waits))
        assert max(waits) - min(waits) > ceiling / 10  # spread, not one instant
