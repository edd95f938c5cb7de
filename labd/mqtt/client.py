"""What every MQTT client of labd shares, the daemon's bridge and the GPU-host agents alike:
the broker's address, sockets that send small messages at once, a session that ends
quietly when the broker goes, and a publish that a cancellation can stop. Loads nothing of
the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
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


class _Client(aiomqtt.Client):
    """aiomqtt's client, less one race (aiomqtt 2.5.1): paho asks for a write watch on its
    socket and aiomqtt schedules it for the loop with the socket's number read then; when
    the connection closes before the loop gets there (a publish into a broker that just
    died), asyncio's ``add_writer`` meets a closed descriptor and logs an ERROR with a
    traceback (uvloop: a RuntimeError for its closed handle). Here the number is read when
    the watch is made, a closed socket (-1) gets none, and one that closes under it ends
    the session as a lost connection does; a number reused meanwhile by another socket is
    never watched by mistake."""

    def _on_socket_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        def written() -> None:
            try:
                client.loop_write()
            except Exception as exc:  # a broken pipe: the connection is gone
                if not self._disconnected.done():
                    self._disconnected.set_exception(exc)

        def watch() -> None:
            fileno = sock.fileno()
            if fileno < 0:
                return
            try:
                self._loop.add_writer(fileno, written)
            except (OSError, RuntimeError) as exc:  # uvloop: the socket's handle closed
                if not self._disconnected.done():
                    self._disconnected.set_exception(
                        aiomqtt.MqttError(f"the connection closed under a write: {exc}"))

        self._loop.call_soon_threadsafe(watch)


@contextlib.asynccontextmanager
async def session(**options: Any) -> AsyncIterator[aiomqtt.Client]:
    """``async with aiomqtt.Client(**options)``, sending small messages at once, and ending
    without a word of its own when the broker goes: the caller reports that (and
    reconnects)."""
    client = _Client(**options, socket_options=NO_DELAY, logger=WIRE)
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


#: The longest an MQTT client of labd waits between two tries to reach the broker. The
#: daemon gives its hosts' agents this long (and a little) to come back after it has
#: (labd.hosts.monitor): the two are one setting.
RECONNECT_MAX_S = 5.0


def backoff(tries: int) -> float:
    """How long to wait before try ``tries + 1`` to reach the broker: doubling from 0.1 s
    up to :data:`RECONNECT_MAX_S`, each wait drawn at random from its upper half so that a
    pod's agents do not all come back in the same instant."""
    ceiling = min(0.1 * 2 ** min(tries, 16), RECONNECT_MAX_S)
    return random.uniform(ceiling / 2, ceiling)
