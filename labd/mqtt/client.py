"""What every MQTT client of labd shares, the daemon's bridge and the GPU-host agents alike:
the broker's address, sockets that send small messages at once, a session that ends
quietly when the broker goes, and a publish that a cancellation can stop. Loads nothing of
the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiomqtt

from labd.errors import BusError, LabdError

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Wire(logging.Filter):
    """paho reports a lost connection as ERROR lines ("failed to receive on socket") from
    inside its callbacks; labd says it once, as a warning with what it does next (it
    reconnects). Those lines are kept, at INFO, for whoever asks with -v."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            log.info("MQTT connection: %s", record.getMessage())
            return False
        return True


#: The logger aiomqtt and paho write to, for every client of labd.
WIRE = logging.getLogger("labd.mqtt.wire")
WIRE.addFilter(_Wire())


@contextlib.asynccontextmanager
async def session(**options: Any) -> AsyncIterator[aiomqtt.Client]:
    """``async with aiomqtt.Client(**options)``, sending small messages at once, and ending
    without a word of its own when the broker goes: the caller reports that (and
    reconnects)."""
    client = aiomqtt.Client(**options, socket_options=NO_DELAY, logger=WIRE)
    try:
        async with client:
            yield client
    finally:
        # aiomqtt keeps a lost connection's error in a future that nobody reads once the
        # session has ended, and asyncio would print it as "Future exception was never
        # retrieved" with a traceback: read it here (the caller has its own copy).
        lost = getattr(client, "_disconnected", None)
        if isinstance(lost, asyncio.Future) and lost.done() and not lost.cancelled():
            lost.exception()

#: Small messages go out at once. Without TCP_NODELAY a message sent right behind another
#: (an agent's event after its heartbeat) waits for the broker's delayed ACK: 40 ms on Linux.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


async def _cancellable(call: Awaitable[T]) -> T:
    """An aiomqtt call, run so that a cancellation reaches the caller. aiomqtt waits for
    the broker's answer with asyncio.wait_for, which on Python 3.11 can swallow a
    cancellation that lands as the wait ends: a task looping on publishes would then never
    stop, and one cancelled as its subscription was confirmed would go on into its session
    (and the TaskGroup or the daemon's stop waiting for it would wait forever). Awaited
    through a shield, the cancellation is ours to receive."""
    running = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        running.cancel()
        # Nobody awaits it any more: take its outcome so it is not reported as lost.
        running.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise


async def publish(client: aiomqtt.Client, topic: str, payload: str | bytes, *, qos: int = 0,
                  retain: bool = False) -> None:
    """``client.publish``, cancellable (:func:`_cancellable`)."""
    await _cancellable(client.publish(topic, payload, qos=qos, retain=retain))


async def subscribe(client: aiomqtt.Client, topic: str, *, qos: int = 0) -> None:
    """``client.subscribe``, cancellable (:func:`_cancellable`)."""
    await _cancellable(client.subscribe(topic, qos=qos))


def parse_url(url: str) -> tuple[str, int]:
    """Host and port of ``mqtt://HOST[:PORT]`` (1883) or ``mqtts://HOST[:PORT]`` (TLS, 8883)."""
    try:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
    except ValueError:
        raise BusError(f"MQTT broker {url!r}: the port must be a number") from None
    if parts.scheme not in ("mqtt", "tcp", "mqtts") or not parts.hostname:
        raise BusError(f"MQTT broker {url!r}: expected mqtt://HOST[:PORT], or mqtts:// for TLS")
    return parts.hostname, port


def wants_tls(url: str) -> bool:
    """Whether ``url`` names a TLS listener (``mqtts://``)."""
    return url.startswith("mqtts://")


LOCAL_BROKER = "mqtt://127.0.0.1:1883"


def local_broker() -> str | None:
    """The MQTT broker on this machine, if one answers."""
    return LOCAL_BROKER if broker_reachable(LOCAL_BROKER) is None else None


def broker_reachable(url: str) -> str | None:
    """None when an MQTT broker listens at ``url``; otherwise why not."""
    try:
        socket.create_connection(parse_url(url), timeout=2).close()
    except (OSError, LabdError) as exc:
        return str(exc)
    return None
