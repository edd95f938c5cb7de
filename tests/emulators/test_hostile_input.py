"""Hostile and careless clients against the emulators' SCPI, TL1 and Qontrol parsers, over
real sockets and a real pty: every bad message is refused on its own session, in the
protocol's own way, at once; the session and every other session answer the next command;
nothing is logged as a traceback and no memory is spent on what a client merely names."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import pytest
import serial
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators import EmulatedLab, EmulatorSpec
from emulators.lab import ServeSpec
from emulators.wire.numbers import MAX_MESSAGE_BYTES, MAX_NUMBER_CHARS, wire_float, wire_int
from emulators.wire.scpi import ScpiError, parse_lists, parse_number
from emulators.wire.tl1 import Deny, parse_ports

FAST = {"switch_time_ms": 1.0, "jitter_ms": 0.2}
IDN = "Polatis,N-OST-16x16-LA1-DMHNS,002414,6.5.2.18"
LOGIN = b"ACT-USER::admin:1::root;"
TIMEOUT = 10.0


@pytest.fixture
async def lab(caplog: pytest.LogCaptureFixture) -> AsyncIterator[EmulatedLab]:
    specs = [
        EmulatorSpec("ocs", "polatis", {"size": "16x16"}, dict(FAST)),
        EmulatorSpec("cal", "calient", {"ports": 64, "users": {"admin": "secret"}}, dict(FAST)),
        EmulatorSpec("pm", "thorlabs", {}, {}),
        EmulatorSpec("n77", "keysight", {}, {}),
        EmulatorSpec("mesh", "mesh", {"ports": 4}, {}, serve={"serial": ServeSpec(serve="pty")}),
    ]
    caplog.set_level(logging.WARNING)
    async with EmulatedLab(specs, control=False) as emulated:
        yield emulated
    # Whatever came in, nothing was a traceback, an unretrieved task error, or a command
    # that only the endpoint's safety net caught.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _address(address: str) -> tuple[str, int]:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


def converse(address: str, data: bytes) -> bytes:
    """Send ``data``, close our side, and return all the device said until it closed its
    side: every message was read and answered first."""
    with socket.create_connection(_address(address), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = bytearray()
        while chunk := sock.recv(65536):
            out += chunk
        return bytes(out)


class Line:
    """A client that stays connected: one request, the reply up to ``until``."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_connection(_address(address), timeout=TIMEOUT)
        self.pending = b""

    def ask(self, data: bytes, until: bytes | re.Pattern[bytes]) -> bytes:
        self.sock.sendall(data)
        while True:
            found = (self.pending.find(until) + len(until) if isinstance(until, bytes)
                     and until in self.pending else
                     m.end() if isinstance(until, re.Pattern)
                     and (m := until.search(self.pending)) else -1)
            if found >= 0:
                reply, self.pending = self.pending[:found], self.pending[found:]
                return reply
            chunk = self.sock.recv(65536)
            assert chunk, f"the device closed the line; had {self.pending[-200:]!r}"
            self.pending += chunk

    def close(self) -> None:
        self.sock.close()


def tl1_done(ctag: str) -> re.Pattern[bytes]:
    return re.compile(rf"M  {ctag} (COMPLD|DENY)[^;]*;".encode())


@pytest.fixture
def lines() -> Iterator[list[Line]]:
    opened: list[Line] = []
    yield opened
    for line in opened:
        line.close()


# -- the reproductions, each a regression test -------------------------------------------

async def test_tl1_range_far_beyond_the_switch_is_denied_at_once(lab: EmulatedLab) -> None:
    def session() -> tuple[bytes, bytes, int]:
        line = Line(lab.endpoints["ocs"]["tl1"])
        try:
            assert b"COMPLD" in line.ask(LOGIN, tl1_done("1"))
            tracemalloc.start()
            try:
                denied = line.ask(b"ENT-PATCH::1&&1000000000,17&&1000000016:3;", tl1_done("3"))
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            return denied, line.ask(b"RTRV-PATCH:::4:;", tl1_done("4")), peak
        finally:
            line.close()

    denied, after, peak = await asyncio.to_thread(session)
    assert b"M  3 DENY\r\n   IIAC\r\n" in denied
    assert b"port 1000000000 out of range 1..32" in denied
    assert b"M  4 COMPLD" in after
    assert peak < 1024 * 1024  # nothing was expanded
    assert lab.device("ocs").model.connections == {}


async def test_scpi_range_far_beyond_the_switch_is_an_error_in_the_queue(
        lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(
        converse, lab.endpoints["ocs"]["scpi"],
        b":OXC:SWIT:CONN:ADD (@1:99999999999),(@17)\n:SYST:ERR?\n*IDN?\n")
    assert out.decode().split("\r\n") == [
        '-222, "Data out of range; port 99999999999 out of range 1..32"', IDN, ""]


async def test_scpi_list_longer_than_the_switch_is_refused(lab: EmulatedLab) -> None:
    ranges = ",".join(["1:32"] * 1000)
    out = await asyncio.to_thread(
        converse, lab.endpoints["ocs"]["scpi"],
        f":OXC:SWIT:PORT:STAT? (@{ranges})\n:SYST:ERR?\n*IDN?\n".encode())
    assert out.decode().split("\r\n") == [
        '-224, "Illegal parameter value; more than 32 ports in one list"', IDN, ""]


async def test_tl1_list_longer_than_the_switch_is_refused(lab: EmulatedLab) -> None:
    aid = "&".join(["1&&32"] * 1000)
    out = await asyncio.to_thread(
        converse, lab.endpoints["ocs"]["tl1"],
        LOGIN + f"RTRV-PORT-SHUTTER::{aid}:2:;RTRV-HDR:::3:;".encode())
    assert b"M  2 DENY\r\n   IPNV\r\n   /* Parameter not valid: more than 32 ports" in out
    assert b"M  3 COMPLD" in out


def board(path: str, requests: list[bytes], until: bytes = b"1234\n") -> list[bytes]:
    """Each request, then ``lifetime?`` (answered ``1234``): the lines it got back."""
    with serial.Serial(path, 115200, timeout=TIMEOUT) as port:
        out = []
        for request in requests:
            port.write(request + b"\nlifetime?\n")
            got = port.read_until(until)
            assert got.endswith(until), f"no answer after {request[:40]!r}: {got!r}"
            out.append(got)
        return out


async def test_mesh_board_channel_of_4301_digits_is_an_error_line(lab: EmulatedLab) -> None:
    path = lab.endpoints["mesh"]["serial"].removeprefix("serial://")
    out = await asyncio.to_thread(board, path, [b"v" + b"7" * 4301 + b"=1", b"nchan?",
                                                b"v" + b"9" * 10 + b"=1", b"v0=1" + b"0" * 400,
                                                b"v0=nan", b"vmax0=inf", b"v0=1.5"])
    assert out[0].startswith(b"E12:00\n")
    assert out[1] == b"8\n1234\n"
    assert out[2].startswith(b"E12:9999999999\n")
    assert out[3].startswith(b"E11:00\n")
    assert out[4].startswith(b"E11:00\n")
    assert out[5].startswith(b"E11:00\n")
    assert out[6] == b"OK\n1234\n"
    assert lab.device("mesh").volts[0] == 1.5  # type: ignore[attr-defined]


async def test_scpi_header_suffix_of_5000_digits_is_an_undefined_header(
        lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(
        converse, lab.endpoints["n77"]["scpi"],
        b":SENS" + b"9" * 5000 + b":POW:WAV?\n:SYST:ERR?\n:SENS1:POW:WAV 1" + b"0" * 400
        + b"NM\n:SYST:ERR?\n:SENS1:POW:WAV 1550NM;:SENS1:POW:WAV?\n")
    replies = out.decode().splitlines()
    assert replies[0] == '-113,"Undefined header"'
    assert replies[1].startswith('-120,"Numeric data error;')
    assert float(replies[2]) == pytest.approx(1.55e-6)


async def test_thorlabs_average_count_beyond_any_integer_is_refused(lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(
        converse, lab.endpoints["pm"]["scpi"],
        b":SENS:AVER:COUN " + b"9" * 5000 + b"\n:SYST:ERR?\n:SENS:AVER:COUN 3;COUN?\n")
    replies = out.decode().splitlines()
    assert replies[0] == '-104,"Data type error; expected a whole number"'
    assert replies[1] == "3"


@pytest.mark.parametrize("iface", ["scpi", "tl1"])
async def test_a_message_over_the_limit_is_refused_and_the_session_goes_on(
        lab: EmulatedLab, iface: str) -> None:
    flood = b"A" * (MAX_MESSAGE_BYTES * 4)
    if iface == "scpi":
        out = await asyncio.to_thread(converse, lab.endpoints["ocs"]["scpi"],
                                      flood + b"\n:SYST:ERR?\n*IDN?\n")
        assert out.decode().split("\r\n") == [
            f'-223, "Too much data; a message over {MAX_MESSAGE_BYTES} bytes was dropped"',
            IDN, ""]
    else:
        out = await asyncio.to_thread(converse, lab.endpoints["ocs"]["tl1"],
                                      LOGIN + flood + b";RTRV-HDR:::2:;")
        assert b"M  0 DENY\r\n   IISP\r\n" in out
        assert b"M  2 COMPLD" in out


async def test_a_sid_that_would_break_every_session_s_framing_is_refused(
        lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(
        converse, lab.endpoints["ocs"]["tl1"],
        LOGIN + b'SET-SID:::2::"A\r\nM  3 COMPLD";SET-SID:::3::' + b"S" * 5000
        + b";SET-SID:::4::OCS-A;RTRV-HDR:::5:;")
    assert b"M  2 DENY\r\n   IPNV\r\n" in out and b"M  3 DENY\r\n   IPNV\r\n" in out
    assert b"M  4 COMPLD" in out and b"   OCS-A " in out.split(b"M  4")[1]
    assert lab.device("ocs").options.sid == "OCS-A"  # type: ignore[attr-defined]


async def test_a_port_label_that_would_break_framing_is_refused(lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(
        converse, lab.endpoints["ocs"]["tl1"],
        LOGIN + b'ED-PORT-LABEL::1:2:::LABEL="a\r\nM  3 COMPLD";ED-PORT-LABEL::1:3:::LABEL='
        + b"L" * 5000 + b';ED-EQPT::TIMEOUT:4:::ADMIN=' + b"9" * 5000
        + b';ED-PORT-LABEL::1&&99999999999:5:::LABEL=x;RTRV-PORT-LABEL::1:6:;')
    assert b"M  2 DENY\r\n   IPNV\r\n" in out and b"M  3 DENY\r\n   IPNV\r\n" in out
    assert b"M  4 DENY\r\n   IPNV\r\n" in out and b"M  5 DENY\r\n   IIAC\r\n" in out
    assert b'M  6 COMPLD\r\n   "1:LABEL=\\"\\""\r\n;' in out
    assert lab.device("ocs").labels == {}  # type: ignore[attr-defined]


async def test_the_mesh_board_refuses_an_overlong_line(lab: EmulatedLab) -> None:
    path = lab.endpoints["mesh"]["serial"].removeprefix("serial://")
    out = await asyncio.to_thread(board, path, [b"v0=" + b"1," * MAX_MESSAGE_BYTES, b"id?"])
    assert out[0].startswith(b"E14:00\n")
    assert out[1] == b"Q8iv-01A0\n1234\n"


async def test_a_flood_without_an_end_does_not_grow_the_read_buffer(lab: EmulatedLab) -> None:
    """8 MiB with no line end: held back by flow control, dropped in limit-sized pieces."""
    flood = b"B" * (8 * 1024 * 1024) + b"\n*IDN?\n"
    tracemalloc.start()
    try:
        out = await asyncio.to_thread(converse, lab.endpoints["ocs"]["scpi"], flood)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.decode().endswith(IDN + "\r\n")
    assert peak < 2 * 1024 * 1024


async def test_other_sessions_answer_while_one_is_hostile(
        lab: EmulatedLab, lines: list[Line]) -> None:
    def sessions() -> list[bytes]:
        calm = Line(lab.endpoints["ocs"]["scpi"])
        hostile = Line(lab.endpoints["ocs"]["scpi"])
        cal = Line(lab.endpoints["cal"]["tl1"])
        lines.extend((calm, hostile, cal))
        out = [hostile.ask(b":OXC:SWIT:CONN:ADD (@1:99999999999),(@1" + b"7" * 5000
                           + b");:SYST:ERR?\n", b"\r\n")]
        out.append(calm.ask(b"*IDN?\n", b"\r\n"))
        out.append(cal.ask(b"ACT-USER::admin:1::secret;ENT-CRS::1." + b"1" * 5000
                           + b".1,1.1.2:2::;", tl1_done("2")))
        out.append(hostile.ask(b"*IDN?\n", b"\r\n"))
        out.append(cal.ask(b"RTRV-CRS:::3:;", tl1_done("3")))
        return out

    out = await asyncio.to_thread(sessions)
    assert out[0].startswith(b'-222, "Data out of range; port 99999999999')
    assert out[1] == out[3] == IDN.encode() + b"\r\n"
    assert b"M  2 DENY\r\n   IIAC\r\n   /* Invalid AID '1.111" in out[2]
    assert len(out[2]) < 1024  # the comment quotes the AID cut short
    assert b"M  3 COMPLD" in out[3 + 1]


# -- the parsers, directly ---------------------------------------------------------------

_NUMBERISH = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["inf", "-inf", "nan", "NaN", "1e999", "-1e-999", "0x10", "1_000", "١٢",
                     "", " ", "+", "-", ".", "1.", ".5", "1e", "9" * 5000, "1" * 33]),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(_NUMBERISH)
def test_wire_numbers_are_bounded_and_finite(text: str) -> None:
    for convert in (wire_int, wire_float):
        try:
            value = convert(text)
        except ValueError:
            continue
        assert len(text.strip()) <= MAX_NUMBER_CHARS
        assert value == value and abs(value) < float("inf")


_LIST_ITEM = st.one_of(_NUMBERISH, st.tuples(_NUMBERISH, _NUMBERISH).map(":".join))
_CHANNEL_LISTS = st.lists(st.lists(_LIST_ITEM, max_size=6).map(lambda items: "(@"
                          + ",".join(items) + ")"), max_size=3).map(",".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_CHANNEL_LISTS, st.text(max_size=40)), st.integers(min_value=1, max_value=768))
def test_scpi_channel_lists_stay_within_the_device(text: str, limit: int) -> None:
    try:
        lists = parse_lists(text, limit)
    except ScpiError as exc:
        assert exc.code in (-104, -109, -222, -224)
        return
    for ports in lists:
        assert len(ports) <= limit and all(1 <= p <= limit for p in ports)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.one_of(_NUMBERISH, st.just("")), max_size=8).map("&".join),
                 st.text(max_size=40)), st.integers(min_value=1, max_value=768))
def test_tl1_port_lists_stay_within_the_device(aid: str, limit: int) -> None:
    try:
        ports = parse_ports(aid, limit)
    except Deny as deny:
        assert deny.code in ("IIAC", "IPNV")
        assert len(deny.comment) < 160 and deny.comment.isascii()
        return
    assert len(ports) <= limit and all(1 <= p <= limit for p in ports)


@settings(max_examples=300, deadline=None)
@given(_NUMBERISH, st.sampled_from(["", "NM", "M", "DBM", "S", "MS", "W", "XYZ"]))
def test_scpi_numbers_are_finite_or_refused(number: str, unit: str) -> None:
    try:
        value = parse_number(number + unit, ("NM", "M", "DBM", "S", "MS"))
    except ScpiError as exc:
        assert exc.code in (-104, -120, -131)
        return
    assert abs(value) < float("inf")


# -- whole sessions over real sockets, fed what hypothesis makes -------------------------

_SCPI_WORDS = st.sampled_from([
    ":OXC:SWIT:CONN:ADD", ":OXC:SWIT:CONN:SUB", ":OXC:SWIT:CONN:ONLY", "STAT?",
    ":OXC:SWIT:CONN:PORT?", ":OXC:SWIT:PORT:STAT?", ":OXC:SWIT:PORT:DIS", ":OXC:SWIT:PORT:ENAB",
    ":PMON:POW?", "*RST", ":SYST:ERR?", ":SYST:ERR:ALL?", ":OXC:BOOT:MODE", "*IDN?",
    ":SENS2:POW:WAV", ":SENS:AVER:COUN", ":SENS1:FUNC:PAR:LOGG", ":SENS1:POW:ATIM", ":FOO",
    "SENS1:CHAN1:POW:WAV?", ":TRIGGER1:INPUT", "CMEASURE", "SENS:CORR:POW:PDI:RESP?",
    "SENS:AVER", "SENS:CORR:BEAM", "CORR", "SYST:LFR", "*SRE", ":SENS1:POW:REF:STATE",
    "LOGGING,START", ":SENS1:FUNC:LOOP", "SENS:POW:RANG:UPP?", "MIN", "MAXIMUM", "[:", "]",
    ":", "::", "?", "*", "(@", ")", ";", ",", '"', "(@1:16),(@17:32)", "(@)", " "])
_SCPI_LINE = st.lists(st.one_of(_SCPI_WORDS, _NUMBERISH, st.text(max_size=6)),
                      max_size=10).map(" ".join)

_TL1_WORDS = st.sampled_from([
    "ENT-PATCH", "DLT-PATCH", "RTRV-PATCH", "RTRV-PORT-SHUTTER", "OPR-PORT-SHUTTER",
    "RTRV-PORT-POWER", "RTRV-EQPT", "SET-SID", "INIT-SYS", "ENT-CRS", "ACT-CRS", "CANC-CRS",
    "DLT-CRS", "RTRV-CRS", "RTRV-PORT", "ACT-USER", "CANC-USER", ":", "::", "&", "&&", ",",
    '"', "*/", "ALL", "1.1.1", "1.2.3", "=", "PARAMETER=SIZE", "SYSTEM", "ED-PORT-LABEL",
    "RTRV-PORT-LABEL", "ED-EQPT", "TIMEOUT", "ATTEN", "BOOT", "LABEL=", "ADMIN=", "MODE=",
    "PARAMETER=CONFIG", "RTRV-PORT-SUM", "SET-PORT-ATTEN", "\\", '\\"'])
_TL1_MESSAGE = st.lists(st.one_of(_TL1_WORDS, _NUMBERISH, st.text(max_size=6)),
                        max_size=12).map("".join).map(lambda m: m.replace(";", ""))

_BOARD_WORDS = st.sampled_from([
    "v", "i", "vmax", "imax", "vall", "iall", "vvec", "ivec", "vfull", "ifull", "nchan", "id",
    "firmware", "nup", "nupall", "=", "?", ",", "."])
_BOARD_LINE = st.lists(st.one_of(_BOARD_WORDS, _NUMBERISH, st.text(max_size=6)),
                       max_size=8).map("".join).map(
    lambda m: m.replace("\n", "").replace("\r", ""))


def _ascii(text: str) -> bytes:
    return text.encode("utf-8", "replace")


async def test_scpi_sessions_survive_what_hypothesis_sends(lab: EmulatedLab) -> None:
    devices = ["ocs", "pm", "n77"]
    idn = {d: (await asyncio.to_thread(converse, lab.endpoints[d]["scpi"], b"*IDN?\n")).strip()
           for d in devices}

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(line=_SCPI_LINE, device=st.sampled_from(devices))
    def check(line: str, device: str) -> None:
        tried.append(line)
        data = _ascii(line).replace(b"\n", b" ")
        out = converse(lab.endpoints[device]["scpi"], data + b"\n*CLS;*IDN?\n")
        assert out.rstrip().endswith(idn[device]), out[-300:]

    tried: list[str] = []
    await asyncio.to_thread(check)
    assert len(tried) >= 200


async def test_tl1_sessions_survive_what_hypothesis_sends(lab: EmulatedLab) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(message=_TL1_MESSAGE, device=st.sampled_from(["ocs", "cal"]))
    def check(message: str, device: str) -> None:
        tried.append(message)
        login = LOGIN if device == "ocs" else b"ACT-USER::admin:1::secret;"
        out = converse(lab.endpoints[device]["tl1"],
                       login + _ascii(message) + b";RTRV-HDR:::77777:;")
        assert b"M  77777 COMPLD" in out, out[-300:]

    tried: list[str] = []
    await asyncio.to_thread(check)
    assert len(tried) >= 200


async def test_the_board_session_survives_what_hypothesis_sends(lab: EmulatedLab) -> None:
    path = lab.endpoints["mesh"]["serial"].removeprefix("serial://")

    def run() -> None:
        with serial.Serial(path, 115200, timeout=TIMEOUT) as port:
            @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
            @given(line=_BOARD_LINE)
            def check(line: str) -> None:
                tried.append(line)
                if "lifetime" in line.lower():
                    return
                port.write(_ascii(line) + b"\nlifetime?\n")
                got = port.read_until(b"1234\n")
                assert got.endswith(b"1234\n"), got[-200:]

            check()

    tried: list[str] = []
    await asyncio.to_thread(run)
    assert len(tried) >= 200
