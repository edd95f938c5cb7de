"""The three transports against real peers: TCP, a pty through pyserial, VISA (pyvisa-py)."""

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from emulators import EmulatedLab
from instruments.address import parse_address
from instruments.errors import ConnectError, InstrumentClosed, InstrumentTimeout
from instruments.link import Link, LinkSettings
from instruments.polatis_scpi import PolatisScpi
from instruments.transports import wirestamp
from instruments.transports.base import ReceiveBuffer


async def test_visa_socket_transport_drives_a_switch(lab: EmulatedLab) -> None:
    host, port = lab.endpoints["ocs1"]["scpi"].removeprefix("tcp://").split(":")
    address = f"visa://TCPIP::{host}::{port}::SOCKET"
    async with PolatisScpi(address, name="v") as sw:
        await sw.connect([(1, 17)])
        assert await sw.cross_connects() == {1: 17}
        assert sw.info is not None and sw.info.size == "16x16"


async def test_serial_transport_query_and_timeout(lab: EmulatedLab) -> None:
    address = lab.endpoints["ocspty"]["scpi"] + "?baud=115200"
    link = Link(address, LinkSettings(timeout=0.2))
    await link.open()
    try:
        assert (await link.query("*IDN?")).startswith("Polatis,N-OST-8x8")
        await link.write(":OXC:SWIT:CONN:ADD (@1),(@9)")  # silent command: no reply
        with pytest.raises(InstrumentTimeout, match=r"within 0\.2 s"):
            await link.read_line()
    finally:
        await link.close()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:1", "serial:///dev/does-not-exist",
                                     "visa://TCPIP::127.0.0.1::1::SOCKET"])
async def test_connect_errors_are_mapped(address: str) -> None:
    link = Link(address, LinkSettings(timeout=1))
    with pytest.raises(ConnectError, match="cannot"):
        await link.open()


async def test_raw_bytes_are_logged_at_debug(lab: EmulatedLab,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="instruments.wire")
    link = Link(lab.endpoints["ocs1"]["scpi"], name="ocs1")
    await link.open()
    await link.query("*IDN?")
    await link.close()
    assert "ocs1 >> b'*IDN?\\n'" in caplog.text
    assert "ocs1 << b'Polatis," in caplog.text


KERNEL_STAMPS = pytest.mark.skipif(sys.platform != "linux",
                                   reason="arrivals are the kernel's stamps on Linux only")


@pytest.fixture
async def kernel_stamping() -> AsyncIterator[None]:
    """Stamping on for the whole machine while the test runs: the kernel turns it on a
    moment after a socket first asks (then keeps it on while one has it), so a test's first
    segments could otherwise come unstamped."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, wirestamp.SO_TIMESTAMPNS, 1)
    try:
        async with asyncio.timeout(5):
            while True:
                tx.sendto(b".", rx.getsockname())
                _, ancillary, _, _ = rx.recvmsg(8, wirestamp.ANCILLARY_SIZE)
                if ancillary:
                    break
                await asyncio.sleep(0.001)  # the kernel's worker has not run yet
        yield
    finally:
        rx.close()
        tx.close()


#: How far before the send a kernel stamp may read: on loopback it was seen up to 65 µs
#: before a reading taken just before the send (in 2 runs of 40; why, not pinned down).
#: Far below the 50 ms the loop is held, which is what these tests tell apart.
STAMP_SLACK_NS = 500_000


def hold_the_loop() -> int:
    """Keep the event loop from running for a while, as a busy machine would; returns when
    it is free again. Nothing waits on this: it makes the gap the stamps must see past."""
    time.sleep(0.05)
    return time.monotonic_ns()


@KERNEL_STAMPS
@pytest.mark.usefixtures("kernel_stamping")
async def test_a_replys_arrival_is_when_it_landed_not_when_the_loop_read_it() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    link = Link(f"tcp://127.0.0.1:{port}", LinkSettings(timeout=2))
    await link.open()
    peer, _ = listener.accept()  # already queued by the kernel
    try:
        link.mark()
        await link.write("QUERY?")
        before = time.monotonic_ns()
        peer.sendall(b"answer\n")
        free = hold_the_loop()
        assert await link.read_line() == "answer"
        assert link.answered_ns is not None and link.sent_ns is not None
        assert link.sent_ns <= before <= link.answered_ns + STAMP_SLACK_NS
        assert link.answered_ns < free
    finally:
        await link.close()
        peer.close()
        listener.close()


@KERNEL_STAMPS
@pytest.mark.usefixtures("kernel_stamping")
async def test_an_emulated_switch_keeps_its_timing_from_the_commands_arrival(
        lab: EmulatedLab) -> None:
    """However late the emulator's process reads a command, the mirrors start when it
    landed; the units of one program message still run one after the other."""
    lab.set_timing("ocs1", {"switch_time_ms": 20, "jitter_ms": 0})
    seen = lab.truth("ocs1", light=False)["changes"]
    host, port = lab.endpoints["ocs1"]["scpi"].removeprefix("tcp://").split(":")
    client = socket.create_connection((host, int(port)))
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        before = time.monotonic_ns()
        client.sendall(b":OXC:SWIT:CONN:ADD (@1),(@17);:OXC:SWIT:CONN:ADD (@2),(@18);*OPC?\n")
        free = hold_the_loop()
        async with asyncio.timeout(5):
            reply = await loop.sock_recv(client, 100)
        assert reply.strip() == b"1"
    finally:
        client.close()
    first, second = lab.truth("ocs1", seen[-1]["seq"] if seen else 0, light=False)["changes"]
    assert before <= first["arrived_ns"] + STAMP_SLACK_NS and first["arrived_ns"] < free
    assert first["settled_ns"] - first["arrived_ns"] == 20_000_000
    assert second["arrived_ns"] >= first["settled_ns"]
    assert second["settled_ns"] - second["arrived_ns"] == 20_000_000


def test_the_clocks_offset_is_kept_and_measured_again_after_a_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The realtime → monotonic offset is measured once, tightly; a wall clock stepped by a
    second (as NTP or an operator may) is noticed at the next stamp and measured again."""
    monkeypatch.setattr(wirestamp, "_offset", None)
    first, _ = wirestamp.clock_offset()
    again, _ = wirestamp.clock_offset()
    assert again == first  # kept: not measured anew for every stamp
    real = time.time_ns
    monkeypatch.setattr(wirestamp.time, "time_ns", lambda: real() + 1_000_000_000)
    stepped, _ = wirestamp.clock_offset()
    assert abs(stepped - (first - 1_000_000_000)) < wirestamp.STEP_NS


def _waiting_read(buffer: ReceiveBuffer, timeout: float) -> Coroutine[Any, Any, bytes]:
    """A line read, stepped by hand until it waits for bytes (it has armed its timeout)."""
    read = buffer.read_until(b"\n", timeout)
    read.send(None)
    return read


def _finish(read: Coroutine[Any, Any, bytes]) -> bytes:
    with pytest.raises(StopIteration) as done:
        read.send(None)
    value: bytes = done.value.value
    return value


async def test_a_read_after_a_longer_one_still_times_out_on_its_own_deadline() -> None:
    # The receive buffer keeps one timer for many reads: a read whose deadline comes
    # before the timer's must have it moved, or it waits for the longer read's timeout.
    buffer = ReceiveBuffer(parse_address("tcp://127.0.0.1:5025"))
    first = _waiting_read(buffer, 60)
    buffer.feed(b"one\n")
    assert _finish(first) == b"one\n"
    with pytest.raises(InstrumentTimeout, match=r"within 0\.05 s"):
        async with asyncio.timeout(5):
            await buffer.read_until(b"\n", 0.05)
    buffer.close()


async def test_an_earlier_reads_timer_does_not_end_a_later_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = ReceiveBuffer(parse_address("tcp://127.0.0.1:5025"))
    fired = asyncio.Event()
    expire = buffer._expire

    def expired() -> None:
        expire()
        fired.set()

    monkeypatch.setattr(buffer, "_expire", expired)
    first = _waiting_read(buffer, 0.05)
    buffer.feed(b"one\n")
    assert _finish(first) == b"one\n"
    second = asyncio.create_task(buffer.read_until(b"\n", 60))
    # The first read's timer fires while the second waits: armed again, for the second.
    async with asyncio.timeout(5):
        await fired.wait()
    assert not second.done()
    assert buffer._timer is not None and buffer._timer_at == buffer._deadline
    buffer.feed(b"two\n")
    assert await second == b"two\n"
    buffer.close()


async def test_closing_the_link_ends_a_read_that_waits() -> None:
    # The read's timer goes with the channel, so the read must not be left to it.
    listener = socket.create_server(("127.0.0.1", 0))
    link = Link(f"tcp://127.0.0.1:{listener.getsockname()[1]}", LinkSettings(timeout=60))
    await link.open()
    peer, _ = listener.accept()
    try:
        read = link.read_line()
        read.send(None)  # stepped by hand until it waits for the reply
        await link.close()
        with pytest.raises(InstrumentClosed, match="was closed"):
            read.send(None)
    finally:
        peer.close()
        listener.close()


async def test_a_second_read_while_one_waits_is_refused_and_the_first_goes_on() -> None:
    buffer = ReceiveBuffer(parse_address("tcp://127.0.0.1:5025"))
    first = _waiting_read(buffer, 60)
    second = buffer.read_until(b"\n", 60)
    with pytest.raises(RuntimeError, match="while another is waiting"):
        second.send(None)
    buffer.feed(b"one\n")
    assert _finish(first) == b"one\n"
    buffer.close()
