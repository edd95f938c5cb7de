"""The machinery of tests/emulators/test_fidelity.py: a row of a fidelity table, a raw client
on a real TCP socket or a real pty, and the exchange that sends a row's bytes and takes the
device's answer back, byte for byte.

What "the answer" is, per protocol (every wait is a read with a deadline, none a sleep):

* SCPI and the Qontrol board: the row's bytes, then a sentinel query on a line of its own
  (``*IDN?``, ``id?``); the answer is everything the device said before the sentinel's own
  answer. A command that answers nothing therefore reads as ``b""``.
* TL1: the row's bytes; once the response block of the row's (last) ctag is in, a sentinel
  ``RTRV-HDR``; the answer is everything before the sentinel's block: the row's response
  blocks, and the autonomous messages the device sent after them (it sends them before it
  reads the next command), and a prompt where the device prints one.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Generous: a row that passes never waits for it; one that fails says what came instead.
TIMEOUT = 20.0
CRLF = "\r\n"
NIL = "( nil )"
#: The TL1 sentinel's correlation tag (labd's ctags wrap at 999999: none of the rows use it).
SENTINEL_CTAG = "999999"
SENTINEL_TL1 = f"RTRV-HDR:::{SENTINEL_CTAG}:;".encode()

Expect = bytes | re.Pattern[bytes]
#: A step before the row: bytes to send (their answer must be ``before_answer``), or
#: something done to the device itself (a port fails, a head is unplugged), in its loop.
Step = bytes | Callable[[Any], None]


@dataclass(frozen=True)
class Check:
    """A condition on the emulated device after the row (its model, not its wire)."""

    what: str
    test: Callable[[Any], bool]

    def __call__(self, device: Any) -> bool:
        return self.test(device)


@dataclass(frozen=True)
class Row:
    section: str
    """The section of docs/protocols.md that documents the command (``1.1``)."""
    command: str
    """The command as docs/protocols.md writes it (a table's first cell, verbatim)."""
    send: bytes
    expect: Expect
    note: str = ""
    """Which form: a [?] option, a reply variant, the section's example."""
    before: tuple[Step, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    then: Check | None = None
    serve: str = "tcp"
    login: bool = True
    """TL1: log in first."""
    opening: bool = False
    """Serial: the answer includes what the device said when its port opened."""
    ctag: str | None = None
    """TL1: the ctag whose response ends the row (default: the last command's)."""

    @property
    def id(self) -> str:
        text = f"§{self.section} {self.command}" + (f" [{self.note}]" if self.note else "")
        return re.sub(r"\s+", " ", text)


def row(section: str, command: str, send: bytes, expect: Expect, note: str = "",
        **kwargs: Any) -> Row:
    return Row(section, command, send, expect, note, **kwargs)


def shape(pattern: bytes) -> re.Pattern[bytes]:
    """An answer of this shape (the whole answer matches)."""
    return re.compile(pattern)


def matches(expect: Expect, got: bytes) -> bool:
    if isinstance(expect, bytes):
        return got == expect
    return expect.fullmatch(got) is not None


ANY = re.compile(rb"(?s).*")


# -- TL1 blocks, as patterns: everything exact but the header's date and time ------------

class Rx(str):
    """A piece of a TL1 pattern given as a regular expression, not as literal text."""


def _text(piece: str) -> bytes:
    return piece.encode() if isinstance(piece, Rx) else re.escape(piece.encode())


def _head(sid: str) -> bytes:
    return rb"\r\n\n   " + re.escape(sid.encode()) + rb" \d\d-\d\d-\d\d \d\d:\d\d:\d\d\r\n"


def compld(ctag: str, *lines: str, sid: str = NIL) -> bytes:
    body = b"".join(rb'   "' + _text(line) + rb'"\r\n' for line in lines)
    return _head(sid) + b"M  " + re.escape(ctag.encode()) + rb" COMPLD\r\n" + body + b";"


def deny(ctag: str, code: str, comment: str, sid: str = NIL) -> bytes:
    return (_head(sid) + b"M  " + re.escape(ctag.encode()) + rb" DENY\r\n   "
            + re.escape(code.encode()) + rb"\r\n   /\* " + _text(comment) + rb" \*/\r\n;")


def report(alarm: str, verb: str, *lines: str, sid: str = NIL) -> bytes:
    """An autonomous message: ``A``, ``*``, ``**`` or ``*C``, an atag, the verb line."""
    body = b"".join(rb'   "' + _text(line) + rb'"\r\n' for line in lines)
    return (_head(sid) + re.escape(f"{alarm:<2}".encode()) + rb" \d+ " + re.escape(verb.encode())
            + rb"\r\n" + body + b";")


def tl1(*blocks: bytes, tail: bytes = b"") -> re.Pattern[bytes]:
    """These blocks, one after the other, and nothing else (but ``tail`` after each)."""
    return re.compile(b"".join(block + re.escape(tail) for block in blocks))


def ctag_of(data: bytes) -> str:
    """The ctag of the last command in ``data``; an empty one is answered as 0."""
    commands = [c for c in data.decode("ascii", "replace").split(";") if c.strip()]
    fields = commands[-1].strip().split(":") + [""] * 4
    return fields[3].strip() or "0"


# -- a raw client ------------------------------------------------------------------------

class Wire:
    """Bytes to and from a device: a TCP socket, or a pty opened as a serial line is (no
    flush of what the device already wrote, no line discipline: the emulator set it raw)."""

    def __init__(self, address: str) -> None:
        self.pending = b""
        self._sock: socket.socket | None = None
        self._fd = -1
        if address.startswith("tcp://"):
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            self._sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        else:
            self._fd = os.open(address.removeprefix("serial://"), os.O_RDWR | os.O_NOCTTY)

    @property
    def serial(self) -> bool:
        return self._sock is None

    def send(self, data: bytes) -> None:
        if self._sock is not None:
            self._sock.sendall(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def _receive(self, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b""
        if self._sock is not None:
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                return b""
            if not chunk:
                raise AssertionError(f"the device closed the line; had {self.pending!r}")
            return chunk
        ready, _, _ = select.select([self._fd], [], [], remaining)
        return os.read(self._fd, 65536) if ready else b""

    def until(self, end: Callable[[bytes], int | None], what: str) -> bytes:
        """Read until ``end(pending)`` gives the length of what was awaited; take that."""
        deadline = time.monotonic() + TIMEOUT
        while (length := end(self.pending)) is None:
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {what} within {TIMEOUT:g} s; had {self.pending!r}")
            self.pending += self._receive(deadline)
        taken, self.pending = self.pending[:length], self.pending[length:]
        return taken

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._fd >= 0:
            os.close(self._fd)


def in_loop(loop: asyncio.AbstractEventLoop, step: Callable[[Any], None], device: Any) -> None:
    """Do ``step`` to the device in the emulators' loop (their thread), and wait for it."""

    async def call() -> None:
        step(device)

    asyncio.run_coroutine_threadsafe(call(), loop).result(TIMEOUT)


# -- the exchanges -----------------------------------------------------------------------

@dataclass(frozen=True)
class LineProtocol:
    """SCPI or the board: line replies, a sentinel query to know an answer is complete."""

    sentinel: bytes
    sentinel_answer: Callable[[Any], bytes]
    before_answer: Expect = b""

    def ask(self, wire: Wire, data: bytes, expect: Expect, answer: bytes) -> bytes:
        """Send ``data`` and the sentinel; return what came before the sentinel's answer,
        as soon as that matches ``expect`` (else, at the deadline, the assertion says what
        came: an answer that happens to end like the sentinel's is read on)."""
        wire.send(data + self.sentinel)

        def end(buffer: bytes) -> int | None:
            if buffer.endswith(answer) and matches(expect, buffer[:-len(answer)]):
                return len(buffer)
            return None

        try:
            return wire.until(end, "answer")[:-len(answer)]
        except AssertionError:
            got = wire.pending
            return got[:-len(answer)] if got.endswith(answer) else got

    def exchange(self, wire: Wire, loop: asyncio.AbstractEventLoop, device: Any,
                 r: Row) -> bytes:
        answer = self.sentinel_answer(device)
        if wire.serial and not r.opening:
            self.ask(wire, b"", ANY, answer)  # what the device said when its port opened
        for step in r.before:
            if isinstance(step, bytes):
                got = self.ask(wire, step, self.before_answer, answer)
                assert matches(self.before_answer, got), f"setup {step!r} answered {got!r}"
            else:
                in_loop(loop, step, device)
        return self.ask(wire, r.send, r.expect, answer)


def _block_end(buffer: bytes, ctag: str, tail: bytes) -> int | None:
    """Where the response block of ``ctag`` (and the prompt after it) ends, once it is in."""
    found = re.search(b"M  " + re.escape(ctag.encode()) + rb" (?:COMPLD|DENY)\r\n", buffer)
    if found is None:
        return None
    end = buffer.find(b"\r\n;", found.end() - 2)
    if end < 0 or len(buffer) < end + 3 + len(tail):
        return None
    return end + 3 + len(tail)


@dataclass(frozen=True)
class Tl1Protocol:
    login: bytes

    def step(self, wire: Wire, data: bytes, ctag: str, tail: bytes) -> bytes:
        wire.send(data)
        wire.until(lambda b: 0 if _block_end(b, ctag, tail) is not None else None,
                   f"response to ctag {ctag}")
        wire.send(SENTINEL_TL1)
        taken = wire.until(lambda b: _block_end(b, SENTINEL_CTAG, tail), "sentinel response")
        start = taken.rfind(b"\r\n\n", 0, taken.rfind(f"M  {SENTINEL_CTAG} ".encode()))
        return taken[:start]

    def exchange(self, wire: Wire, loop: asyncio.AbstractEventLoop, device: Any,
                 r: Row) -> bytes:
        prompt = str(r.options.get("prompt", ""))
        tail = f"{CRLF}{prompt}".encode() if prompt else b""
        if r.login:
            got = self.step(wire, self.login, ctag_of(self.login), tail)
            assert b" COMPLD\r\n" in got, f"login answered {got!r}"
        for step in r.before:
            if isinstance(step, bytes):
                ctag = ctag_of(step)
                got = self.step(wire, step, ctag, tail)
                assert f"M  {ctag} COMPLD".encode() in got, f"setup {step!r} answered {got!r}"
            else:
                in_loop(loop, step, device)
        return self.step(wire, r.send, r.ctag or ctag_of(r.send), tail)


# -- checks on the device ----------------------------------------------------------------

def connections(expected: dict[int, int]) -> Check:
    return Check(f"connections {expected}", lambda d: d.model.connections == expected)


def port_states(expected: dict[int, str]) -> Check:
    return Check(f"port states {expected}",
                 lambda d: all(d.model.state_of(p) == s for p, s in expected.items()))


def holds(what: str, test: Callable[[Any], bool]) -> Check:
    return Check(what, test)


def fail(port: int) -> Callable[[Any], None]:
    """The port fails (the control endpoint's ``fail_port``)."""
    return lambda d: d.model.set_port_state(port, "F")


def restore(port: int) -> Callable[[Any], None]:
    return lambda d: d.model.set_port_state(port, "E")


def meter_fault(kind: str, channel: int | None = None) -> Callable[[Any], None]:
    return lambda d: d.meter.set_fault(channel, kind)
