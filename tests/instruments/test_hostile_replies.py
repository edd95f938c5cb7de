"""Drivers facing a device that answers badly: a 5,000-digit number, ``inf``, ``nan``,
garbage, nothing, a channel list naming a billion ports. Every such reply is a labd
:class:`InstrumentError` (a :class:`ProtocolError` naming the instrument and the command),
never a raw ValueError or OverflowError, and never memory spent on what the reply names.

The devices are real TCP servers that answer each message by a table (one answer replaced
by the hostile one); hypothesis picks the hostile answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instruments import InstrumentError, ProtocolError
from instruments.calient import CalientTl1
from instruments.connection import Backoff
from instruments.keysight import KeysightN77xx
from instruments.link import LinkSettings
from instruments.numbers import MAX_NUMBER_CHARS, reply_float, reply_int
from instruments.polatis_scpi import PolatisScpi
from instruments.polatis_tl1 import PolatisTl1
from instruments.qontrol import QontrolBoard
from instruments.scpi import parse_channel_lists, parse_error, parse_floats
from instruments.thorlabs import ThorlabsPM100
from instruments.tl1 import parse_aid_list
from instruments.transports.base import BUFFER_LIMIT
from tests.scripted import address_of, tl1_block

FAST = Backoff(initial=0.01, maximum=0.05)
HUGE = "9" * 5000
#: As a parameter, under a short test id.
HUGE_P = pytest.param(HUGE, id="5000-digits")

#: What a well-behaved device answers, by the start of the message.
POLATIS = {
    "*IDN?": "Polatis,N-OST-16x16-LA1-DMHNS,002414,6.5.2.18",
    ":OXC:SWIT:CONN:STAT?": "(@1),(@17)",
    ":OXC:SWIT:CONN:ADD": '1;0, "No error"',
    ":PMON:POW?": '(-3.00,-4.00);0, "No error"',
    ":OXC:SWIT:PORT:STAT?": "(E,E)",
}
POLATIS_NO_SIZE = {**POLATIS, "*IDN?": "Polatis,N-OST,002414,6.5.2.18",
                   ":OXC:SWIT:SIZE?": "16,16"}
THORLABS = {
    "*IDN?": "Thorlabs,PM100D,P0012345,2.8.0",
    ":SYST:SENS:IDN?": "S122C,12345,01-Jan-2024,1,18,289",
    ":SENS:AVER:COUN?": "10",
    ":SENS:POW:UNIT?": "DBM",
    ":MEAS:POW?": '-3.500000E+00;0,"No error"',
    ":SENS:CORR:WAV?": "1.550000E+03",
}
KEYSIGHT = {
    "*IDN?": "Keysight Technologies,N7744A,MY12345678,1.220",
    ":SENS1:POW:ATIM?": "1.000000E-03", ":SENS2:POW:ATIM?": "1.000000E-03",
    ":SENS3:POW:ATIM?": "1.000000E-03", ":SENS4:POW:ATIM?": "1.000000E-03",
    ":SENS1:POW:UNIT?": "0", ":SENS2:POW:UNIT?": "0", ":SENS3:POW:UNIT?": "0",
    ":SENS4:POW:UNIT?": "0",
    ":READ1:POW?": '-3.500000E+00;+0,"No error"',
    ":SENS1:POW:WAV?": "1.550000E-06",
}
BOARD = {"id?": "Q8iv-01A0", "nchan?": "8", "nup=0": "", "nupall?": "Q8iv-01A0 : 0",
         "vfull?": "12.0 V", "ifull?": "24.0 mA",
         "vall?": "\n".join(["0.0000"] * 8)}
TL1 = {
    "ACT-USER": [],
    "RTRV-NETYPE": ["Polatis,N-OST-16x16-LA1-DMHNS,OCS,6.5.2.18"],
    "RTRV-INV": ["OCS:SN=002414,PN=N-OST-16x16"],
    "RTRV-EQPT": ["SYSTEM:SIZE=16x16"],
    "RTRV-PATCH": ["1,17"],
    "RTRV-PORT-POWER": ["1:-3.00", "2:-4.00"],
    "RTRV-PORT-SHUTTER": ["1:OPEN", "2:OPEN"],
}
CALIENT = {
    "ACT-USER": [],
    "RTRV-NE": ["SERIALNUMBER=CAL-1,SWPACKAGE=7.3.1,STATUS=OK,CHASSISTYPE=S320"],
    "RTRV-PORT": [f"1.1.{p}:TYPE=OPTICAL,AS=IS,OS=IS,ALIAS=" for p in range(1, 5)],
    "RTRV-CRS": ["c1:SRCPORT=1.1.1,DSTPORT=1.1.2,GRPNAME=SYSTEM,CONNNAME=c1,CONNTYPE=2WAY,"
                 "AS=IS,OS=IS,OC=OK"],
}


class Responder:
    """A device on a real TCP port that answers each message (cut at ``separator``) by
    ``answer``; bytes back as they are, ``None`` for no answer."""

    def __init__(self, separator: bytes, answer: Callable[[str], bytes | None]) -> None:
        self.separator, self.answer = separator, answer
        self._server: asyncio.Server | None = None
        self._lines: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

    async def __aenter__(self) -> Responder:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._lines:
            writer.close()  # the conversation sees its end and returns
        await asyncio.gather(*self._lines.values())
        await self._server.wait_closed()

    @property
    def address(self) -> str:
        return address_of(self._server)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._lines[writer] = task
        try:
            while True:
                message = await reader.readuntil(self.separator)
                reply = self.answer(message.decode("latin-1").strip())
                if reply:
                    writer.write(reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def by_table(table: dict[str, str], terminator: bytes, hostile: tuple[str, bytes] | None
             ) -> Callable[[str], bytes | None]:
    def answer(message: str) -> bytes | None:
        for key in sorted(table, key=len, reverse=True):
            if message.lower().startswith(key.lower()):
                if hostile is not None and hostile[0] == key:
                    return hostile[1]
                return table[key].encode() + terminator if table[key] else None
        return None
    return answer


def by_tl1_table(table: dict[str, list[str]], hostile: tuple[str, bytes] | None
                 ) -> Callable[[str], bytes | None]:
    def answer(message: str) -> bytes | None:
        fields = message.split(":")
        verb, ctag = fields[0].strip(), (fields + [""] * 4)[3]
        if hostile is not None and hostile[0] == verb:
            return hostile[1].replace(b"{ctag}", ctag.encode())
        return tl1_block(ctag, table.get(verb, []))
    return answer


Scenario = Callable[[Any], Awaitable[object]]


async def exercise(driver: Any, steps: list[Scenario]) -> list[InstrumentError]:
    """Open the driver and run each step; return the labd errors that came out (anything
    else fails the test)."""
    errors: list[InstrumentError] = []
    try:
        await driver.open()
    except InstrumentError as exc:
        errors.append(exc)
        return errors
    try:
        for step in steps:
            try:
                await step(driver)
            except InstrumentError as exc:
                errors.append(exc)
    finally:
        await driver.close()
    return errors


def polatis_scpi(address: str, timeout: float) -> PolatisScpi:
    return PolatisScpi(address, name="ocs", backoff=FAST, settings=LinkSettings(timeout=timeout))


def thorlabs(address: str, timeout: float) -> ThorlabsPM100:
    return ThorlabsPM100(address, name="pm", backoff=FAST,
                         settings=LinkSettings(timeout=timeout))


def keysight(address: str, timeout: float) -> KeysightN77xx:
    return KeysightN77xx(address, name="n77", backoff=FAST,
                         settings=LinkSettings(timeout=timeout))


def board(address: str, timeout: float) -> QontrolBoard:
    return QontrolBoard(address, name="mesh", backoff=FAST,
                        settings=LinkSettings(timeout=timeout))


def calient(address: str, timeout: float) -> CalientTl1:
    return CalientTl1(address, name="cal", backoff=FAST, user="admin", password="secret",
                      settings=LinkSettings(write_termination="\r\n", read_termination="\n",
                                            timeout=timeout))


def polatis_tl1(address: str, timeout: float) -> PolatisTl1:
    return PolatisTl1(address, name="ocs", backoff=FAST, user="admin", password="root",
                      settings=LinkSettings(write_termination="\r\n", read_termination="\n",
                                            timeout=timeout))


SWITCH_STEPS: list[Scenario] = [
    lambda d: d.connect([(2, 18)]), lambda d: d.port_power([1, 2]),
    lambda d: d.port_states([1, 2]), lambda d: d.cross_connects()]
METER_STEPS: list[Scenario] = [lambda d: d.read_power(1), lambda d: d.wavelength(1)]
BOARD_STEPS: list[Scenario] = [lambda d: d.volts()]


async def run_against(kind: str, hostile: tuple[str, bytes] | None,
                      timeout: float = 5.0) -> list[InstrumentError]:
    """The driver of ``kind`` against its table device, ``hostile`` = (the message whose
    answer is replaced, the answer). A well-behaved device answers far inside ``timeout``
    even on a loaded machine."""
    if kind == "tl1":
        async with Responder(b";", by_tl1_table(TL1, hostile)) as dev:
            return await exercise(polatis_tl1(dev.address, timeout), SWITCH_STEPS)
    if kind == "calient":
        async with Responder(b";", by_tl1_table(CALIENT, hostile)) as dev:
            return await exercise(calient(dev.address, timeout), [
                lambda d: d.connect([(3, 4)]), lambda d: d.port_states([1, 2]),
                lambda d: d.cross_connects()])
    table, make, steps, terminator = {
        "polatis": (POLATIS, polatis_scpi, SWITCH_STEPS, b"\r\n"),
        "polatis-size": (POLATIS_NO_SIZE, polatis_scpi, SWITCH_STEPS, b"\r\n"),
        "thorlabs": (THORLABS, thorlabs, [*METER_STEPS, lambda d: d.wavelength_range()],
                     b"\n"),
        "keysight": (KEYSIGHT, keysight, METER_STEPS, b"\n"),
        "board": (BOARD, board, BOARD_STEPS, b"\n"),
    }[kind]
    async with Responder(b"\n", by_table(table, terminator, hostile)) as dev:
        return await exercise(make(dev.address, timeout), steps)


def assert_named(errors: list[InstrumentError], name: str, command: str) -> ProtocolError:
    protocol = [e for e in errors if isinstance(e, ProtocolError)]
    assert protocol, errors
    assert protocol[0].instrument == name
    assert command in str(protocol[0]), str(protocol[0])
    assert len(str(protocol[0])) < 400  # the reply is quoted cut short
    return protocol[0]


# -- the reproductions, each a regression test -------------------------------------------

async def test_table_devices_are_well_behaved() -> None:
    for kind in ("polatis", "polatis-size", "thorlabs", "keysight", "board", "tl1", "calient"):
        assert await run_against(kind, None) == [], kind


@pytest.mark.parametrize("reply", [HUGE_P, "inf", "-inf", "nan", "1e999", "", "x,y"])
async def test_polatis_scpi_open_with_a_bad_size(reply: str) -> None:
    errors = await run_against("polatis-size", (":OXC:SWIT:SIZE?", f"{reply},16\r\n".encode()))
    assert_named(errors, "ocs", ":OXC:SWIT:SIZE?")
    errors = await run_against("polatis", ("*IDN?", f"Polatis,N-OST-{HUGE}x16-LA1,1,2\r\n"
                                           .encode()))
    assert_named(errors, "ocs", "*IDN?")


async def test_scpi_error_entry_with_a_5000_digit_code() -> None:
    errors = await run_against("polatis", (":OXC:SWIT:CONN:ADD",
                                           f'1;-{HUGE}, "Bad"\r\n'.encode()))
    assert_named(errors, "ocs", ":OXC:SWIT:CONN:ADD")


@pytest.mark.parametrize("reply", ["inf", "nan", HUGE_P, "1e999", "-5", "0", ""])
async def test_thorlabs_average_count_that_is_not_a_count(reply: str) -> None:
    errors = await run_against("thorlabs", (":SENS:AVER:COUN?", f"{reply}\n".encode()))
    assert_named(errors, "pm", ":SENS:AVER:COUN?")


async def test_a_channel_list_naming_a_billion_ports_is_refused_unexpanded() -> None:
    errors = await run_against("polatis", (":OXC:SWIT:CONN:STAT?",
                                           b"(@1:999999999),(@17:1000000015)\r\n"))
    assert_named(errors, "ocs", ":OXC:SWIT:CONN:STAT?")


@pytest.mark.parametrize(("verb", "lines"), [
    pytest.param("RTRV-EQPT", [f"SYSTEM:SIZE={HUGE}x16"], id="size"),
    pytest.param("RTRV-PATCH", [f"1,{HUGE}"], id="patch"),
    pytest.param("RTRV-PORT-POWER", ["1:inf", "2:-4.00"], id="power-inf"),
    pytest.param("RTRV-PORT-POWER", [f"1:{HUGE}", "2:1"], id="power-digits"),
    pytest.param("RTRV-PORT-SHUTTER", [f"{HUGE}:OPEN"], id="shutter-port")])
async def test_tl1_data_lines_with_numbers_out_of_bounds(verb: str, lines: list[str]) -> None:
    errors = await run_against("tl1", (verb, tl1_block("{ctag}", lines)))
    assert_named(errors, "ocs", verb)


@pytest.mark.parametrize(("verb", "lines"), [
    pytest.param("RTRV-CRS", [f"c1:SRCPORT=1.1.{HUGE},DSTPORT=1.1.2"], id="crs-digits"),
    pytest.param("RTRV-CRS", ["c1:SRCPORT=1.1,DSTPORT=1.1.2"], id="crs-short-aid"),
    pytest.param("RTRV-CRS", ["c1:SRCPORT=1.1.inf,DSTPORT=1.1.2"], id="crs-inf")])
async def test_calient_data_lines_with_ports_out_of_bounds(verb: str, lines: list[str]) -> None:
    errors = await run_against("calient", (verb, tl1_block("{ctag}", lines)))
    assert_named(errors, "cal", verb)


@pytest.mark.parametrize(("query", "reply"), [
    pytest.param("nchan?", HUGE, id="nchan-digits"),
    pytest.param("nchan?", "99999999", id="nchan-too-many"),
    pytest.param("vfull?", "inf V", id="vfull-inf"), pytest.param("vfull?", "V", id="vfull-unit"),
    pytest.param("vall?", "\n".join(["nan"] * 8), id="vall-nan"),
    pytest.param("vall?", "\n".join([HUGE] * 8), id="vall-digits")])
async def test_qontrol_board_answers_out_of_bounds(query: str, reply: str) -> None:
    errors = await run_against("board", (query, f"{reply}\n".encode()))
    assert_named(errors, "mesh", query)


async def test_keysight_averaging_time_beyond_reason() -> None:
    errors = await run_against("keysight", (":SENS1:POW:ATIM?", b"1e300\n"))
    assert_named(errors, "n77", ":SENS1:POW:ATIM?")


async def test_a_reply_that_never_ends_fails_at_the_limit_not_the_timeout() -> None:
    endless = (("*IDN?", b"A" * (BUFFER_LIMIT + 4 * 1024 * 1024)))
    async with Responder(b"\n", by_table(POLATIS, b"\r\n", endless)) as dev:
        errors = await exercise(PolatisScpi(dev.address, name="ocs", backoff=FAST,
                                            settings=LinkSettings(timeout=30)), [])
    assert len(errors) == 1 and isinstance(errors[0], ProtocolError), errors
    assert f"reply longer than {BUFFER_LIMIT} bytes" in str(errors[0])
    assert errors[0].instrument == "ocs"


# -- the parsers, directly ---------------------------------------------------------------

_NUMBERISH = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["inf", "-inf", "nan", "NaN", "1e999", "-1e-999", "0x10", "1_000", "١٢",
                     "", " ", "+", "-", ".", "1.", ".5", "1e", HUGE, "1" * 33]),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(_NUMBERISH)
def test_reply_numbers_are_bounded_and_finite(text: str) -> None:
    for convert in (reply_int, reply_float):
        try:
            value = convert(text, "Q?", "dev")
        except ProtocolError as exc:
            assert exc.instrument == "dev" and "'Q?'" in exc.message
            assert len(exc.message) < 300
            continue
        assert len(text.strip()) <= MAX_NUMBER_CHARS
        assert abs(value) < float("inf")


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.lists(st.lists(st.one_of(_NUMBERISH, st.tuples(_NUMBERISH, _NUMBERISH).map(":".join)),
                      max_size=6).map(lambda items: "(@" + ",".join(items) + ")"),
             max_size=3).map(",".join),
    st.text(max_size=40)), st.integers(min_value=1, max_value=768))
def test_reply_channel_lists_stay_within_the_device(text: str, limit: int) -> None:
    try:
        lists = parse_channel_lists(text, command="Q?", instrument="dev", limit=limit)
    except ProtocolError as exc:
        assert exc.instrument == "dev"
        return
    for ports in lists:
        assert len(ports) <= limit and all(1 <= p <= limit for p in ports)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.one_of(_NUMBERISH, st.just("")), max_size=8).map("&".join),
                 st.text(max_size=40)), st.integers(min_value=1, max_value=768))
def test_reply_tl1_port_lists_stay_within_the_device(text: str, limit: int) -> None:
    try:
        ports = parse_aid_list(text, limit, "dev")
    except ProtocolError as exc:
        assert exc.instrument == "dev"
        return
    assert len(ports) <= limit and all(1 <= p <= limit for p in ports)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.tuples(_NUMBERISH, st.text(max_size=20)).map(lambda t: f'{t[0]}, "{t[1]}"'),
                 st.text(max_size=40)),
       st.lists(_NUMBERISH, max_size=5).map(",".join))
def test_error_entries_and_float_lists(entry: str, floats: str) -> None:
    try:
        code, _ = parse_error(entry, instrument="dev")
        assert abs(code) < 10**MAX_NUMBER_CHARS
    except ProtocolError as exc:
        assert exc.instrument == "dev"
    try:
        assert all(abs(v) < float("inf") for v in parse_floats(floats, instrument="dev"))
    except ProtocolError as exc:
        assert exc.instrument == "dev"


# -- whole drivers against devices that answer what hypothesis makes ----------------------

_TARGETS = {
    "polatis": [*POLATIS], "polatis-size": [":OXC:SWIT:SIZE?"], "thorlabs": [*THORLABS],
    "keysight": [*KEYSIGHT], "board": [*BOARD], "tl1": [*TL1], "calient": [*CALIENT],
}
_REPLY_TEXT = st.one_of(
    _NUMBERISH,
    st.sampled_from(["(@1:999999999),(@17)", "(@", "(@)", "(@1),(@17)", '0,"No error"',
                     '1;0,"No error"', f'1;-{HUGE},"x"', "1;", ";;;", "#9999999999",
                     "#0", "#2ab", "E01:03", f"E{HUGE}:1", "OK", "SIZE=16x16",
                     f"SIZE={HUGE}x{HUGE}", "1:OPEN", "1,17", "garbage"]),
    st.text(max_size=30),
)


def _hostile_reply(kind: str, text: str, raw: bytes, use_raw: bool) -> bytes:
    if kind in ("tl1", "calient"):
        lines = [line for line in text.replace("\r", "").split("\n") if '"' not in line]
        return raw.replace(b";", b"") + b";" if use_raw else tl1_block("{ctag}", lines)
    terminator = b"\r\n" if kind.startswith("polatis") else b"\n"
    return (raw.replace(b"\n", b"") if use_raw else text.encode("utf-8", "replace")) + terminator


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(sorted(_TARGETS)), text=_REPLY_TEXT,
       raw=st.binary(max_size=40), use_raw=st.booleans())
def test_drivers_turn_any_reply_into_a_labd_error(
        caplog: pytest.LogCaptureFixture, data: st.DataObject, kind: str, text: str,
        raw: bytes, use_raw: bool) -> None:
    target = data.draw(st.sampled_from(_TARGETS[kind]))
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        asyncio.run(asyncio.wait_for(
            # A short timeout: many hostile answers leave the driver waiting for a line.
            run_against(kind, (target, _hostile_reply(kind, text, raw, use_raw)), 0.5), 30))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
