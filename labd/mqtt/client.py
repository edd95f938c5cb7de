"""What every MQTT client of labd shares, the daemon's bridge and the GPU-host agents alike:
the broker's address, sockets that send small messages at once, and a publish that a
cancellation can stop. Loads nothing of the daemon."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

import aiomqtt

from labd.errors import BusError, LabdError

#: Small messages go out at once. Without TCP_NODELAY a message sent right behind another
#: (an agent's event after its heartbeat) waits for the broker's delayed ACK: 40 ms on Linux.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


async def publish(client: aiomqtt.Client, topic: str, payload: str | bytes, *, qos: int = 0,
                  retain: bool = False) -> None:
    """``client.publish``, run so that a cancellation reaches the caller. aiomqtt waits with
    asyncio.wait_for, which on Python 3.11 can swallow a cancellation that lands as the
    wait ends: a task looping on publishes would then never stop (and a TaskGroup would
    wait for it forever). Awaited through a shield, the cancellation is ours to receive."""
    sending = asyncio.ensure_future(client.publish(topic, payload, qos=qos, retain=retain))
    try:
        await asyncio.shield(sending)
    except asyncio.CancelledError:
        sending.cancel()
        # Nobody awaits it any more: take its outcome so it is not reported as lost.
        sending.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise


def parse_url(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        port = parts.port or 1883
    except ValueError:
        raise BusError(f"MQTT broker {url!r}: the port must be a number") from None
    if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
        raise BusError(f"MQTT broker {url!r}: expected mqtt://HOST[:PORT]")
    return parts.hostname, port


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
