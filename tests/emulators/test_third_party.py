"""Other people's drivers against the emulators: every command form in docs/protocols.md's
third-party table, sent as its public source writes it over a real socket or pty, and the
third-party clients themselves (PyMeasure, the vendor ``qontrol`` library, pyvisa-py)
driving the emulators."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import serial

from emulators import EmulatedLab, EmulatorSpec
from emulators.lab import ServeSpec

FAST = {"switch_time_ms": 1.0, "jitter_ms": 0.2}
TIMEOUT = 10.0
PROTOCOLS = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"


@pytest.fixture
async def lab() -> AsyncIterator[EmulatedLab]:
    specs = [
        EmulatorSpec("ocs", "polatis", {"size": "16x16"}, dict(FAST)),
        EmulatorSpec("cal", "calient", {"ports": 64, "users": {"admin": "secret"}},
                     dict(FAST)),
        EmulatorSpec("calq", "calient", {"ports": 64, "users": {"admin": "secret"}},
                     dict(FAST)),
        EmulatorSpec("pm", "thorlabs", {}, {}),
        EmulatorSpec("n77", "keysight", {}, {}),
        EmulatorSpec("mesh", "mesh", {"ports": 4}, {}, serve={"serial": ServeSpec(serve="pty")}),
    ]
    async with EmulatedLab(specs, control=False) as emulated:
        emulated.device("calq").port_fields = "positional"  # type: ignore[attr-defined]
        yield emulated


def _address(address: str) -> tuple[str, int]:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


# -- the table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Form:
    """One command form a third-party client sends: ``sent`` exactly as its source writes
    it, on ``device`` (an emulator id of the fixture); ``check`` (if any) reads the effect
    back; ``expect`` is a regular expression the answer (of ``check``, else of ``sent``)
    must match."""

    device: str
    sent: str
    expect: str
    check: str = ""
    setup: tuple[str, ...] = ()


_F = r"[+-]?\d\.\d+E[+-]\d\d"  # a float as the meters write it

FORMS = [
    # Thorlabs PM100
    Form("pm", "SYST:SENSOR:IDN?", r"S122C,\d+,[^,]*,1,18,289"),
    Form("pm", "SENS:CORR:WAV? MIN", r"7\.000000E\+02"),
    Form("pm", "SENS:CORR:WAV? MAX", r"1\.800000E\+03"),
    Form("pm", "SENSE:CORR:WAV 1550", r"1\.550000E\+03", check="SENSE:CORR:WAV?"),
    Form("pm", "MEAS:POW?", _F),
    Form("pm", "SENS:CORR:POW:PDI:RESP?", _F),
    Form("pm", "SENS:POW:RANG:UPP?", _F),
    Form("pm", "SENS:CORR:BEAM?", _F),
    Form("pm", "SENS:CURR:RANG:AUTO?", r"1"),
    Form("pm", "SENS:AVER 10", r"10", check="SENS:AVER?"),
    Form("pm", "SENS:CORR 0.0", _F, check="SENS:CORR?"),
    Form("pm", "SENS:POW:RANGE:AUTO?", r"1"),
    Form("pm", "SENS:CURR:RANGE:AUTO?", r"1"),
    Form("pm", "SENS:CURR:RANG:AUTO ON", r"1", check="SENS:CURR:RANG:AUTO?"),
    Form("pm", "INP:FILT?", r"0"),
    Form("pm", "SENS:CORR:COLL:ZERO:MAGN?", _F),
    Form("pm", "SENSE:POW:UNIT DBM", r"DBM", check="SENS:POW:UNIT?"),
    Form("pm", "*CLS;*SRE 0;*ESE 0;:STAT:PRES", r"0", check="*SRE?"),
    Form("pm", "ABOR", r"1", check="*OPC?"),
    Form("pm", "CONF:POW", r"1", check="*OPC?"),
    Form("pm", "SENS:AVER:COUN 1", r"1", check="SENS:AVER:COUN?"),
    Form("pm", "SENS:AVER:COUNT 10", r"10", check="SENS:AVER:COUN?"),
    Form("pm", "SYST:LFR?", r"50"),
    Form("pm", "SENS:CORR:BEAM 5", r"5\.000000E\+00", check="SENS:CORR:BEAM?"),
    Form("pm", "SENS:CORR:BEAM? MIN", _F),
    Form("pm", "SENS:CURR:RANG:UPP? MIN", _F),
    Form("pm", "SENS:CORR? MAX", _F),
    Form("pm", "Read?", _F),
    Form("pm", "CORR 1.5", r"1\.500000E\+00", check="SENS:CORR?"),
    Form("pm", "SENS:POW:RANG:UPP 0.001", r"1\.000000E-03", check="SENS:POW:RANG:UPP?"),
    # Keysight N77xx
    Form("n77", ":SENS1:POW:REF:STATE OFF", r"0", check=":SENS1:POW:REF:STAT?"),
    Form("n77", "SENS1:CHAN1:POW:REF:STATE 0", r"0", check=":SENS1:POW:REF:STAT?"),
    Form("n77", "SENS1:CHAN1:POW:RANGE:AUTO 1", r"1", check=":SENS1:POW:RANG:AUTO?"),
    Form("n77", "SENS1:CHAN1:POW:UNIT W", r"1", check=":SENS1:POW:UNIT?"),
    Form("n77", ":SENS1:CORR 0", _F, check=":SENS1:CORR?"),
    Form("n77", ":TRIGGER1:INPUT CMEASURE", r"CME", check=":TRIG1:INP?"),
    Form("n77", ":TRIGger1:INPut IGN", r"IGN", check=":TRIG1:INP?"),
    Form("n77", ":SENS1:CHAN1:POW:WAV?", r"1\.55000E-06"),
    Form("n77", ":SENSe1:POWer:UNIT 1", r"1", check=":SENS1:POW:UNIT?"),
    Form("n77", ":SENSe1:FUNCtion:PARameter:LOGGing 2,1 MS", r"2,1\.000000E-03",
         check=":SENS1:FUNC:PAR:LOGG?"),
    Form("n77", ":SENSe1:FUNCtion:LOOP 0", r"0", check=":SENS1:FUNC:LOOP?"),
    Form("n77", ":SENSe1:FUNCtion:STATe LOGG,STAR", r"LOGGING_STABILITY,(PROGRESS|COMPLETE)",
         check=":SENSe1:FUNCtion:STATe?"),
    Form("n77", ":SENSE1:FUNCTION:STATE LOGGING,STOP", r"NONE,COMPLETE",
         check=":SENS1:FUNC:STAT?"),
    # Polatis TL1
    Form("ocs-tl1", "ED-EQPT::TIMEOUT:123:::ADMIN=0;", r'"TIMEOUT:ADMIN=0"',
         check="RTRV-EQPT::TIMEOUT:123:::PARAMETER=ADMIN;"),
    Form("ocs-tl1", "ED-EQPT::TIMEOUT:123:::USER=0;", r'"TIMEOUT:USER=0"',
         check="RTRV-EQPT::TIMEOUT:123:::PARAMETER=USER;"),
    Form("ocs-tl1", "ED-EQPT::TIMEOUT:123:::ADMIN=60;", r'"TIMEOUT:ADMIN=60"',
         check="RTRV-EQPT::TIMEOUT:123:::PARAMETER=ADMIN;"),
    Form("ocs-tl1", "ED-EQPT::BOOT:123:::MODE=RESTORE;", r'"BOOT:MODE=RESTORE"',
         check="RTRV-EQPT::BOOT:123:::PARAMETER=MODE;"),
    Form("ocs-tl1", "ED-EQPT::BOOT:123:::MODE=DARK;", r'"BOOT:MODE=DARK"',
         check="RTRV-EQPT::BOOT:123:::PARAMETER=MODE;"),
    Form("ocs-tl1", 'ED-PORT-LABEL::2:123:::LABEL="FCSW49/2/3 in";',
         r'"2:LABEL=\\"FCSW49/2/3 in\\""', check="RTRV-PORT-LABEL::2:123:;"),
    Form("ocs-tl1", "rtrv-eqpt::atten:123:::parameter=config;", r'"ATTEN:CONFIG=NONE"'),
    Form("ocs-tl1", "SET-PORT-ATTEN::33:123:::MODE=NONE;",
         r"DENY\r\n   IICM\r\n   /\* Attenuation not supported"),
    Form("ocs-tl1", "RTRV-PATCH::11&4&10:123:;", r'COMPLD\r\n   "4,20"\r\n',
         setup=("ENT-PATCH::4,20:1:;",)),
    Form("ocs-tl1", "ENT-PATCH::11,28:123:;", r'"11,28"', check="RTRV-PATCH:::123:;"),
    Form("ocs-tl1", "DLT-PATCH::11:123:;", r"COMPLD\r\n;", check="RTRV-PATCH::11:123:;",
         setup=("ENT-PATCH::11,28:1:;",)),
    Form("ocs-tl1", "OPR-PORT-SHUTTER::1&&640:123:;",
         r"DENY\r\n   IIAC\r\n   /\* [^*]*640 out of range 1\.\.32"),
    Form("ocs-tl1", "RTRV-INV::OCS:123:;", r"SN=002414"),
    Form("ocs-tl1", "RTRV-NETYPE:::123:;", r'"Polatis,[^"]*,OCS,'),
    Form("ocs-tl1", "SET-SID:::123::PolatisOXC;", r"PolatisOXC \d\d-", check="RTRV-HDR:::123:;"),
    Form("ocs-tl1", "INIT-SYS::SYSTEM:123::0;", r"COMPLD"),
    Form("ocs-tl1", "CANC-USER::admin:123:;", r"COMPLD"),
    # CALIENT TL1 (Quali's L1 driver)
    Form("calq", "RTRV-NE;", r"SERIALNUMBER=[^,]+,SWPACKAGE=[^,]+,STATUS=OK,CHASSISTYPE=S320"),
    Form("calq", "RTRV-PORT::0;", r'"1\.1\.1:WX,NONE,NONE:INAS=IS,INOS=IS,'),
    Form("cal", "RTRV-PORT::0;", r'"1\.1\.1:TYPE=OPTICAL,AS=IS,OS=IS,ALIAS="'),
    Form("calq", "ENT-CRS::1.1.1,1.1.2:1::Quali,2WAY;", r"CONNNAME=1\.1\.1-1\.1\.2,"
         r"CONNTYPE=2WAY,AS=UMA", check="RTRV-CRS:::::ALL;"),
    Form("calq", "ACT-CRS::1.1.1,1.1.2:1::1.1.1-1.1.2,Quali;",
         r"SRCPORT=1\.1\.1,DSTPORT=1\.1\.2,GRPNAME=Quali,CONNNAME=1\.1\.1-1\.1\.2,"
         r"CONNTYPE=2WAY,AS=IS", check="RTRV-CRS:::::ALL;",
         setup=("ENT-CRS::1.1.1,1.1.2:1::Quali,2WAY;",)),
    Form("calq", "RTRV-PORT-SUM::1.1.1;", r"CONNNAME1=1\.1\.1-1\.1\.2,CONNSTATE1=ACT",
         setup=("ENT-CRS::1.1.1,1.1.2:1::Quali,2WAY;",
                "ACT-CRS::1.1.1,1.1.2:1::1.1.1-1.1.2,Quali;")),
    Form("calq", "RTRV-PORT-SUM::1.1.3;", r"CONNNAME1=NONE,CONNSTATE1=NONE"),
    Form("calq", "CANC-CRS::1.1.1,1.1.2:1::,Quali,1.1.1-1.1.2;",
         r"CONNNAME1=1\.1\.1-1\.1\.2,CONNSTATE1=NONE", check="RTRV-PORT-SUM::1.1.1;",
         setup=("ENT-CRS::1.1.1,1.1.2:1::Quali,2WAY;",
                "ACT-CRS::1.1.1,1.1.2:1::1.1.1-1.1.2,Quali;")),
    Form("calq", "DLT-CRS::1.1.1,1.1.2:1::,Quali,1.1.1-1.1.2;", r"CONNNAME1=NONE",
         check="RTRV-PORT-SUM::1.1.1;", setup=("ENT-CRS::1.1.1,1.1.2:1::Quali,2WAY;",)),
    Form("calq", "CANC-USER::admin:1;", r"COMPLD"),
    # Qontrol (the vendor library, text mode)
    Form("board", "id?", r"Q8iv-01A0"),
    Form("board", "nup=0", r"OK"),
    Form("board", "nupall?", r"Q8iv-01A0 : 0"),
    Form("board", "vfull?", r"12\.0 V"),
    Form("board", "ifull?", r"24\.0 mA"),
    Form("board", "nchan?", r"8"),
    Form("board", "v3=1.5", r"1\.5000", check="v3?"),
    Form("board", "VVEC0=1,2,0,0,0,0,0,0", r"1\.0000\n2\.0000\n0\.0000", check="vall?"),
    Form("board", "vmax3=5", r"5\.0000", check="vmax3?"),
    Form("board", "imax3=10", r"10\.0000", check="imax3?"),
]

LOGINS = {"ocs-tl1": b"ACT-USER::admin:1::root;", "cal": b"ACT-USER::admin:1::secret;",
          "calq": b"ACT-USER::admin:1::secret;"}


class Line:
    """A client that stays connected: one request, the reply up to ``until``."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_connection(_address(address), timeout=TIMEOUT)
        self.pending = b""

    def ask(self, data: bytes, until: re.Pattern[bytes]) -> bytes:
        self.sock.sendall(data)
        while not (match := until.search(self.pending)):
            chunk = self.sock.recv(65536)
            assert chunk, f"the device closed the line; had {self.pending[-200:]!r}"
            self.pending += chunk
        reply, self.pending = self.pending[:match.end()], self.pending[match.end():]
        return reply

    def close(self) -> None:
        self.sock.close()


def _ctag(command: str) -> str:
    fields = command.rstrip(";").split(":")
    return fields[3].strip() if len(fields) > 3 and fields[3].strip() else "0"


def _tl1_done(command: str) -> re.Pattern[bytes]:
    return re.compile(rf"M  {re.escape(_ctag(command))} (COMPLD|DENY)[^;]*;".encode())


def scpi_form(address: str, form: Form, terminator: bytes) -> tuple[str, str]:
    """The answer a form gets (its own, or its check's) and the error entry after it."""
    line = Line(address)
    try:
        line.ask(b"*CLS;*OPC?\n", re.compile(b"1" + terminator))
        last = re.compile(b"[^\n]*" + terminator)
        if form.check or not form.sent.endswith(("?", "MIN", "MAX")):
            line.sock.sendall(form.sent.encode() + b"\n")
            answer = line.ask(form.check.encode() + b"\n", last)
        else:
            answer = line.ask(form.sent.encode() + b"\n", last)
        error = line.ask(b":SYST:ERR?\n", last)
        return answer.decode().strip(), error.decode().strip()
    finally:
        line.close()


def tl1_form(address: str, form: Form) -> str:
    line = Line(address)
    try:
        assert b"COMPLD" in line.ask(LOGINS[form.device], _tl1_done("ACT-USER::admin:1::;"))
        for command in form.setup:
            assert b"COMPLD" in line.ask(command.encode(), _tl1_done(command)), command
        reply = line.ask(form.sent.encode() + b"\r\n", _tl1_done(form.sent))
        if form.check:
            reply = line.ask(form.check.encode() + b"\r\n", _tl1_done(form.check))
        return reply.decode()
    finally:
        line.close()


def board_form(path: str, form: Form) -> str:
    """The lines a form (or its check) gets before ``lifetime?``'s ``1234``."""
    with serial.Serial(path, 115200, timeout=TIMEOUT) as port:
        port.reset_input_buffer()
        port.write(b"lifetime?\n")
        assert port.read_until(b"1234\n").endswith(b"1234\n")
        port.write(form.sent.encode() + b"\n")
        if form.check:
            port.write(form.check.encode() + b"\n")
        port.write(b"lifetime?\n")
        got = port.read_until(b"1234\n")
        assert got.endswith(b"1234\n"), got
        return got.decode()


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f.device}:{f.sent}")
async def test_third_party_form(lab: EmulatedLab, form: Form) -> None:
    is_query = form.sent.rstrip(";").endswith(("?", "MIN", "MAX")) or "RTRV" in form.sent
    assert form.check or is_query or form.device not in ("pm", "n77"), \
        "a setting needs a query that reads it back"
    if form.device in ("pm", "n77"):
        answer, error = await asyncio.to_thread(scpi_form, lab.endpoints[form.device]["scpi"],
                                                form, b"\n")
        assert re.fullmatch(form.expect, answer), answer
        assert re.fullmatch(r'\+?0,"No error"', error), error
    elif form.device == "board":
        path = lab.endpoints["mesh"]["serial"].removeprefix("serial://")
        got = await asyncio.to_thread(board_form, path, form)
        assert re.search(form.expect, got), got
        assert not re.search(r"E\d+:\d+", got), got
    else:
        device = "ocs" if form.device == "ocs-tl1" else form.device
        reply = await asyncio.to_thread(tl1_form, lab.endpoints[device]["tl1"], form)
        assert re.search(form.expect, reply), reply
        if "DENY" not in form.expect:
            assert "DENY" not in reply, reply


def test_the_protocols_table_lists_exactly_the_tested_forms() -> None:
    """docs/protocols.md's third-party table and :data:`FORMS` name the same commands."""
    text = PROTOCOLS.read_text()
    after = text.split("### 10.1 Command forms", 1)[1]
    table = next(block for block in after.split("\n\n") if block.startswith("|"))
    documented = []
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        documented.append(cells[1].strip("`").replace("\\|", "|"))
    assert sorted(documented) == sorted(f.sent for f in FORMS)


# -- the third-party clients themselves ---------------------------------------------------

def require(module: str) -> None:
    """A dev dependency is part of the suite: missing, it fails the test with what to do."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; it is a dev dependency: "
                    "pip install -e '.[dev]'", pytrace=False)


def pymeasure_session(address: str) -> dict[str, Any]:
    from pymeasure.instruments.thorlabs import ThorlabsPM100USB  # type: ignore[import-untyped]

    host, port = _address(address)
    meter = ThorlabsPM100USB(f"TCPIP::{host}::{port}::SOCKET", visa_library="@py",
                             read_termination="\n", write_termination="\n", timeout=5000)
    try:
        out: dict[str, Any] = {"sensor": meter.sensor_name, "power_sensor": meter.is_power_sensor,
                               "settable": meter.wavelength_settable,
                               "min": meter.wavelength_min, "max": meter.wavelength_max}
        meter.wavelength = 1550
        out["wavelength"] = meter.wavelength
        meter.wavelength = 5000  # PyMeasure truncates to the head's range first
        out["clipped"] = meter.wavelength
        out["power"] = meter.power
        out["idn"] = meter.ask("*IDN?").strip()
        return out
    finally:
        meter.adapter.close()


@pytest.mark.filterwarnings("ignore:It is not known whether this device support SCPI")
async def test_pymeasure_thorlabs_pm100usb_drives_the_meter(lab: EmulatedLab) -> None:
    require("pymeasure")
    out = await asyncio.to_thread(pymeasure_session, lab.endpoints["pm"]["scpi"])
    assert out["sensor"] == "S122C" and out["power_sensor"] and out["settable"]
    assert (out["min"], out["max"]) == (700.0, 1800.0)
    assert out["wavelength"] == 1550.0
    assert out["clipped"] == 1800.0
    assert lab.device("pm").snapshot()["channels"]["1"]["wavelength_nm"] == 1800.0
    assert isinstance(out["power"], float) and 0 <= out["power"] < 1
    assert out["idn"].startswith("Thorlabs,PM100D,")


def qontrol_session(path: str) -> dict[str, Any]:
    import qontrol

    q = qontrol.QXOutput(serial_port_name=path, response_timeout=0.5)
    try:
        out: dict[str, Any] = {"id": q.device_id, "chain": q.chain, "n": q.n_chs,
                               "vfull": q.v_full, "ifull": q.i_full}
        q.vmax[2] = 6.0
        q.v[2] = 1.25
        out["v2"] = q.v[2]
        out["vmax2"] = q.vmax[2]
        q.set_all_values("V", [0.5, 0.0, 1.25, 0.0, 0.0, 0.0, 0.0, 2.0])
        out["all"] = q.get_all_values("V")
        return out
    finally:
        q.close()


async def test_the_qontrol_library_drives_the_board(lab: EmulatedLab) -> None:
    require("qontrol")
    path = lab.endpoints["mesh"]["serial"].removeprefix("serial://")
    out = await asyncio.to_thread(qontrol_session, path)
    assert out["id"] == "Q8iv-01A0"
    assert [(d["device_type"], d["n_chs"], d["index"]) for d in out["chain"]] == [("Q8iv", 8, 0)]
    assert (out["n"], out["vfull"], out["ifull"]) == (8, 12.0, 24.0)
    assert (out["v2"], out["vmax2"]) == (1.25, 6.0)
    assert out["all"] == [0.5, 0.0, 1.25, 0.0, 0.0, 0.0, 0.0, 2.0]
    board = lab.device("mesh")
    assert board.volts[:8] == [0.5, 0.0, 1.25, 0.0, 0.0, 0.0, 0.0, 2.0]  # type: ignore[attr-defined]
    assert board.vmax[2] == 6.0  # type: ignore[attr-defined]


def pyvisa_meter_session(pm: str, n77: str) -> list[str]:
    import pyvisa

    rm = pyvisa.ResourceManager("@py")
    out = []
    for address, commands in ((pm, ["SENS:AVER 10", "SENS:AVER?", "SENS:CORR:POW:PDI:RESP?",
                                    "SENS:POW:RANG:UPP?", "SENS:CORR:BEAM?",
                                    "SENS:CURR:RANG:AUTO?", "SYST:ERR?"]),
                              (n77, [":TRIGGER1:INPUT CMEASURE", ":TRIG1:INP?",
                                     ":SENS1:POW:REF:STATE OFF", ":SENS1:CORR 0",
                                     ":SENS1:CHAN1:POW:WAV?", "SYST:ERR?"])):
        host, port = _address(address)
        res = rm.open_resource(f"TCPIP::{host}::{port}::SOCKET", read_termination="\n",
                               write_termination="\n", timeout=5000)
        try:
            for command in commands:
                if command.endswith("?"):
                    out.append(res.query(command))
                else:
                    res.write(command)
        finally:
            res.close()
    return out


async def test_pyvisa_py_sends_the_third_party_forms(lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(pyvisa_meter_session, lab.endpoints["pm"]["scpi"],
                                  lab.endpoints["n77"]["scpi"])
    assert out[0] == "10"
    assert all(float(x) > 0 for x in out[1:4])
    assert out[4:] == ["1", '0,"No error"', "CME", "1.55000E-06", '+0,"No error"']


def test_an_unknown_port_field_form_is_refused() -> None:
    from emulators.lab import build_device

    device = build_device(EmulatorSpec("c", "calient", {}, {}))
    assert device.port_fields == "keyword"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="port_fields 'json'"):
        device.port_fields = "json"  # type: ignore[attr-defined]


async def test_an_n774x_has_one_module_channel(lab: EmulatedLab) -> None:
    form = Form("n77", ":SENS2:CHAN2:POW:WAV 1310NM", "", check=":SENS2:CHAN1:POW:WAV?")
    answer, error = await asyncio.to_thread(scpi_form, lab.endpoints["n77"]["scpi"], form,
                                            b"\n")
    assert answer == "1.55000E-06"  # the setting through CHAN2 was refused
    assert error == '-114,"Header suffix out of range; CHANnel 1 only"'


@pytest.mark.parametrize(("query", "expect"), [("SENS:CORR:WAV? MINIMUM", "7.000000E+02"),
                                               ("SENSE:CORRECTION:WAVELENGTH? MAXIMUM",
                                                "1.800000E+03")])
async def test_pm100_limits_answer_in_long_form(lab: EmulatedLab, query: str,
                                                expect: str) -> None:
    answer, error = await asyncio.to_thread(scpi_form, lab.endpoints["pm"]["scpi"],
                                            Form("pm", query, ""), b"\n")
    assert (answer, error) == (expect, '0,"No error"')
