"""The agents' feed (labd.hosts.feed): whole messages out of a byte stream cut anywhere, in
order, in batches; whatever the broker (or something posing as one) sends, a clear end
rather than an exception; and the real Mosquitto, on the standard loop and on uvloop."""

import asyncio
import itertools
import struct

import aiomqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labd.hosts.feed import MAX_FRAME, FeedProtocol, HostFeed, Message
from labd.mqtt.credentials import BusSettings
from labd.mqtt.topics import lab_root
from tests.broker import BROKER, MQTT, require_broker
from tests.labs import unique_name


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, byte = divmod(n, 128)
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish(topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> bytes:
    body = struct.pack("!H", len(topic)) + topic.encode() + (b"\x00\x07" if qos else b"") \
        + payload
    return bytes([0x30 | qos << 1 | retain]) + _length(len(body)) + body


STREAM = [("labd/x/hosts/h1/heartbeat", b'{"a": 1}', False, 0),
          ("labd/x/hosts/h1/status", b"online", True, 1),
          ("labd/x/hosts/h2/events", b"\x00" * 300, False, 0),  # a two-byte length
          ("labd/x/hosts/h2/heartbeat", b"", False, 0)]
WIRE = b"\x20\x02\x00\x00" + b"\x90\x03\x00\x01\x00" + b"".join(
    publish(t, p, qos=q, retain=r) for t, p, r, q in STREAM) + b"\xd0\x00"  # + PINGRESP


def feed(chunks: list[bytes]) -> tuple[list[Message], int, FeedProtocol]:
    async def go() -> tuple[list[Message], int, FeedProtocol]:
        got: list[Message] = []
        batches = []
        protocol = FeedProtocol(lambda batch: (batches.append(len(batch)), got.extend(batch)))
        for chunk in chunks:
            protocol.data_received(chunk)
        return got, len(batches), protocol
    return asyncio.run(go())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(WIRE)), max_size=12))
def test_a_stream_cut_anywhere_gives_the_same_messages_in_order(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(WIRE)]
    got, _, protocol = feed([WIRE[a:b] for a, b in itertools.pairwise(points)])
    assert got == [(t, p, r) for t, p, r, _ in STREAM]
    assert protocol.connack.result() == 0 and protocol.suback.result() == 0
    assert not protocol.lost.done()


def test_one_read_is_one_batch() -> None:
    got, batches, _ = feed([WIRE])
    assert len(got) == 4 and batches == 1


def test_a_message_too_large_is_dropped_as_it_streams_past_and_the_next_is_kept() -> None:
    big = publish("labd/x/hosts/h1/heartbeat", b"x" * (MAX_FRAME + 10))
    after = publish("labd/x/hosts/h2/heartbeat", b"{}")
    stream = big + after
    got, _, protocol = feed([stream[i:i + 4096] for i in range(0, len(stream), 4096)])
    assert got == [("labd/x/hosts/h1/heartbeat", None, False),
                   ("labd/x/hosts/h2/heartbeat", b"{}", False)]
    assert len(protocol._buffer) == 0  # nothing of it kept


@pytest.mark.parametrize("wire, words", [
    (b"\x30\xff\xff\xff\xff\x7f", "malformed packet length"),
    (b"\x30\x01\x00", "malformed PUBLISH"),
    (b"\x30\x03\x00\x09\x41", "malformed PUBLISH"),  # a topic longer than the packet
])
def test_a_malformed_stream_ends_the_connection_with_why(wire: bytes, words: str) -> None:
    got, _, protocol = feed([wire])
    assert got == []
    with pytest.raises(aiomqtt.MqttError, match=words):
        protocol.lost.result()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_from_the_broker(wire: bytes) -> None:
    got, _, protocol = feed([wire])
    for topic, payload, retained in got:
        assert isinstance(topic, str) and isinstance(retained, bool)
        assert payload is None or isinstance(payload, bytes)
    if protocol.lost.done():
        assert isinstance(protocol.lost.exception(), aiomqtt.MqttError)


async def _round_trip() -> list[Message]:
    root = lab_root(unique_name("feed"))
    got: list[Message] = []
    arrived = asyncio.Event()

    def deliver(batch: list[Message]) -> None:
        got.extend(batch)
        if len(got) >= 201:
            arrived.set()

    async with HostFeed(BusSettings(MQTT), [f"{root}/hosts/+/+"], deliver).connected() as p, \
            aiomqtt.Client(*BROKER) as client:
        keep = asyncio.create_task(HostFeed.keep(p))
        for i in range(200):
            await client.publish(f"{root}/hosts/h{i % 7}/heartbeat", f"{i}".encode())
        await client.publish(f"{root}/other/h1/heartbeat", b"not ours")
        await client.publish(f"{root}/hosts/h1/status", b"x" * 1000, qos=1)
        async with asyncio.timeout(15):
            await arrived.wait()
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
    return got


def test_the_feed_on_the_real_broker_on_both_loops() -> None:
    require_broker()
    import uvloop

    for factory in (asyncio.new_event_loop, uvloop.new_event_loop):
        with asyncio.Runner(loop_factory=factory) as runner:
            got = runner.run(_round_trip())
        assert [p for _, p, _ in got[:200]] == [f"{i}".encode() for i in range(200)]
        assert got[0][0].endswith("/hosts/h0/heartbeat")
        assert got[200][1] == b"x" * 1000  # QoS 1 from the sender: still taken
        assert len(got) == 201  # the topic outside the subscription never came
