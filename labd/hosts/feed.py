"""What the GPU hosts' agents publish, read off the broker in batches: a subscriber of its
own for ``<root>/hosts/+/+`` that speaks just the MQTT 3.1.1 it needs (CONNECT with the
daemon's login, SUBSCRIBE at QoS 0, PUBLISH in, PINGREQ out), over TCP or TLS.

Why not the daemon's aiomqtt session: paho reads a message with a ``recv`` per header byte
and hands it up through several layers and an asyncio queue, about 0.13 ms a heartbeat on
the daemon's loop, more than everything labd does with it; a pod's thousands of hosts at
1 s heartbeats would take most of a core in that alone. Here each read of the socket is
split into whole messages at once and handed over as one batch (``deliver``), for a few µs
a message. The daemon's own traffic (commands and their results, events, retained state,
its last will) stays on aiomqtt (labd.daemon.bus).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
from collections.abc import Callable
from typing import Any, cast

import aiomqtt

from labd.mqtt.client import NO_DELAY
from labd.mqtt.credentials import BusSettings
from labd.mqtt.payload import MAX_BYTES

#: A message from the broker: its topic, its payload (None: too large, dropped unread) and
#: whether it came as retained.
Message = tuple[str, bytes | None, bool]

KEEPALIVE_S = 60
#: The most a message may hold before it is dropped as it streams past (the topic is kept,
#: to say whose it was): what the bus takes, and room for the topic and the seal's envelope.
MAX_FRAME = MAX_BYTES + 64 * 1024
#: Read no more while this many messages wait to be taken: the broker then holds the rest
#: (and the kernel's buffers), not the daemon's memory.
PAUSE_AT = 50_000

_CONNACK = {1: "the broker does not speak MQTT 3.1.1", 2: "the client id was refused",
            3: "the broker is unavailable", 4: "bad user name or password",
            5: "not authorised"}


def _text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(raw)) + raw


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, byte = divmod(n, 128)
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def connect_packet(identifier: str, username: str | None, password: str | None) -> bytes:
    flags = 0x02  # a clean session: what it missed while away is nothing to catch up on
    payload = _text(identifier)
    if username is not None:
        flags |= 0x80
        payload += _text(username)
        if password is not None:
            flags |= 0x40
            payload += _text(password)
    body = _text("MQTT") + bytes([4, flags]) + struct.pack("!H", KEEPALIVE_S) + payload
    return b"\x10" + _length(len(body)) + body


def subscribe_packet(topics: list[str], packet_id: int = 1) -> bytes:
    body = struct.pack("!H", packet_id) + b"".join(_text(t) + b"\x00" for t in topics)
    return b"\x82" + _length(len(body)) + body


PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


class FeedProtocol(asyncio.Protocol):
    """The wire: bytes in, whole messages out, one batch per read of the socket."""

    def __init__(self, deliver: Callable[[list[Message]], None]) -> None:
        self.deliver = deliver
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._skip = 0
        """Bytes still to drop of a message too large to keep."""
        self.connack: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.suback: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are ones.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for waiter in (self.connack, self.suback):
            if not waiter.done():
                waiter.set_exception(aiomqtt.MqttError("the broker closed the connection"))
                waiter.exception()  # whoever waited reads it; nobody else need
        if not self.lost.done():
            self.lost.set_exception(aiomqtt.MqttError(
                f"the broker connection for host messages was lost: {exc}" if exc
                else "the broker closed the connection for host messages"))
            self.lost.exception()  # read here too: nobody may be waiting on it yet

    def data_received(self, data: bytes) -> None:
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        buffer = self._buffer
        buffer += data
        batch: list[Message] = []
        start = 0
        end = len(buffer)
        while end - start >= 2:
            # The remaining length: one to four bytes of 7 bits, least significant first.
            length, scale, at, whole = 0, 1, start + 1, False
            while at < end:
                byte = buffer[at]
                at += 1
                length += (byte & 0x7F) * scale
                if not byte & 0x80:
                    whole = True
                    break
                scale *= 128
                if scale > 128**3:
                    self._fail("a malformed packet length")
                    return
            if not whole:
                break  # the length itself is not all here yet
            kind = buffer[start] >> 4
            if kind == 3 and length > MAX_FRAME:
                # Too large to keep: say whose it was, drop the rest as it streams past.
                topic_len = struct.unpack_from("!H", buffer, at)[0] if at + 2 <= end else -1
                if topic_len < 0 or at + 2 + topic_len > end:
                    break  # wait for the topic
                topic = bytes(buffer[at + 2:at + 2 + topic_len]).decode(errors="replace")
                batch.append((topic, None, bool(buffer[start] & 1)))
                have = end - at
                if have >= length:
                    start = at + length
                    continue
                self._skip = length - have
                start = end
                break
            if at + length > end:
                break  # the rest of this packet is still on its way
            if kind == 3:
                if length < 2:
                    self._fail("a malformed PUBLISH")
                    return
                flags = buffer[start] & 0x0F
                topic_len = (buffer[at] << 8) | buffer[at + 1]
                topic_end = at + 2 + topic_len
                body = topic_end + (2 if flags & 0x06 else 0)
                if topic_len > length - 2 or body > at + length:
                    self._fail("a malformed PUBLISH")
                    return
                topic = buffer[at + 2:topic_end].decode(errors="replace")
                batch.append((topic, bytes(buffer[body:at + length]), bool(flags & 1)))
                if flags & 0x06 and self.transport is not None:
                    # QoS 1 (we subscribe at 0; a broker may still send it): acknowledge.
                    self.transport.write(b"\x40\x02" + bytes(buffer[topic_end:topic_end + 2]))
            elif kind == 2 and not self.connack.done():
                self.connack.set_result(buffer[at + 1] if length >= 2 else 255)
            elif kind == 9 and not self.suback.done():
                # The worst of the codes granted (0x80: refused).
                self.suback.set_result(max(buffer[at + 2:at + length], default=0x80))
            start = at + length
        del buffer[:start]
        if batch:
            self.received += len(batch)
            self.deliver(batch)

    def _fail(self, why: str) -> None:
        self._buffer.clear()
        if not self.lost.done():
            self.lost.set_exception(aiomqtt.MqttError(f"the broker sent {why}"))
            self.lost.exception()
        if self.transport is not None:
            self.transport.abort()

    def pause(self, paused: bool) -> None:
        """Stop (or go on) reading the socket: flow control while a backlog is worked off."""
        if self.transport is None or paused == self.paused or self.transport.is_closing():
            return
        self.paused = paused
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()


class HostFeed:
    """One connection to the broker for the agents' messages, subscribed to ``topics``; each
    read of the socket becomes one call of ``deliver`` with its messages, in order."""

    def __init__(self, settings: BusSettings, topics: list[str],
                 deliver: Callable[[list[Message]], None]) -> None:
        self.settings = settings
        self.topics = topics
        self.deliver = deliver
        self.protocol: FeedProtocol | None = None

    @contextlib.asynccontextmanager
    async def connected(self, timeout: float = 10.0) -> Any:
        """Connected and subscribed, for the block's length: raises aiomqtt.MqttError (the
        bus's sign that the broker is away) when it cannot be."""
        login = self.settings.login()
        loop = asyncio.get_running_loop()
        tls = login.get("tls_context")
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    lambda: FeedProtocol(self.deliver), login["hostname"], login["port"],
                    ssl=tls, server_hostname=login["hostname"] if tls else None)
        except (OSError, TimeoutError) as exc:
            raise aiomqtt.MqttError(f"cannot connect to the broker for host messages: "
                                    f"{exc or 'timed out'}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            for level, option, value in NO_DELAY:
                with contextlib.suppress(OSError):
                    sock.setsockopt(level, option, value)
        self.protocol = protocol
        try:
            transport.write(connect_packet(f"labd-hosts-{secrets.token_hex(4)}",
                                           login.get("username"), login.get("password")))
            async with asyncio.timeout(timeout):
                code = await protocol.connack
                if code:
                    raise aiomqtt.MqttError(f"the broker refused the connection for host "
                                            f"messages: {_CONNACK.get(code, f'code {code}')}")
                transport.write(subscribe_packet(self.topics))
                granted = await protocol.suback
            if granted == 0x80:
                raise aiomqtt.MqttError(f"the broker refused the subscription to "
                                        f"{', '.join(self.topics)} (its ACL: the daemon's "
                                        "login must read the lab's topics)")
        except TimeoutError:
            transport.abort()
            raise aiomqtt.MqttError("the broker did not answer the connection for host "
                                    f"messages within {timeout:.0f} s") from None
        except BaseException:
            transport.abort()
            raise
        try:
            yield protocol
        finally:
            if not transport.is_closing():
                transport.write(DISCONNECT)
                transport.close()
            self.protocol = None

    @staticmethod
    async def keep(protocol: FeedProtocol) -> None:
        """Keep the connection alive until it is lost (then aiomqtt.MqttError)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE_S / 2):
                    await asyncio.shield(protocol.lost)
            if protocol.lost.done():
                protocol.lost.result()  # raises why
            if protocol.transport is not None and not protocol.transport.is_closing():
                protocol.transport.write(PINGREQ)
