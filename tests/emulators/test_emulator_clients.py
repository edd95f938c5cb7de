"""Emulators against standard clients, unchanged: pyvisa over a SOCKET resource, pyserial on
the pty, a raw socket for TL1."""

import asyncio
import re
import socket
from typing import Any

import pytest
import pyvisa
import serial

from emulators import EmulatedLab, EmulatorSpec


def visa_resource(address: str) -> Any:
    host, port = address.removeprefix("tcp://").split(":")
    rm = pyvisa.ResourceManager("@py")
    res = rm.open_resource(f"TCPIP::{host}::{port}::SOCKET")
    res.read_termination = "\r\n"
    res.write_termination = "\n"
    res.timeout = 3000
    return res


def scpi_session_with_pyvisa(address: str) -> list[str]:
    res = visa_resource(address)
    try:
        out = [res.query("*IDN?"), res.query(":OXC:SWIT:SIZE?")]
        res.write(":oxc:swit:conn:add (@1,2),(@17,18)")
        out.append(res.query(":oxc:swit:conn:stat?"))
        out.append(res.query(":oxc:swit:conn:port? 1"))
        out.append(res.query(":oxc:swit:conn:port? 3"))
        res.write(":oxc:swit:conn:sub (@1),(@17)")
        out.append(res.query(":OXC:SWITch:CONNect:STATe?"))
        out.append(res.query(":oxc:swit:conn:add (@3),(@19);*OPC?"))
        out.append(res.query(":oxc:swit:conn:only (@4,5),(@20,21); stat?"))
        res.write(":oxc:swit:disc:all")
        out.append(res.query(":oxc:swit:conn:stat?"))
        res.write(":oxc:swit:conn:add (@99),(@17)")
        out.append(res.query(":SYST:ERR?"))
        res.write(":FOO:BAR")
        out.append(res.query(":SYST:ERR?"))
        out.append(res.query(":SYST:ERR?"))
        out.append(res.query(":pmon:pow? (@20,21)"))
        return out
    finally:
        res.close()


async def test_pyvisa_socket_session_against_polatis_scpi(lab: EmulatedLab) -> None:
    out = await asyncio.to_thread(scpi_session_with_pyvisa, lab.endpoints["ocs1"]["scpi"])
    assert out[0] == "Polatis,N-OST-16x16-LA1-DMHNS,002414,6.5.2.18"
    assert out[1] == "16,16"
    assert out[2] == "(@1,2),(@17,18)"
    assert out[3] == '"17"'
    assert out[4] == '""'
    assert out[5] == "(@2),(@18)"
    assert out[6] == "1"
    assert out[7] == "(@4,5),(@20,21)"  # relative header after ';' resolves under CONN
    assert out[8] == "(@),(@)"
    assert re.fullmatch(r'-222, "Data out of range; port 99.*"', out[9])
    assert out[10] == '-113, "Undefined header"'
    assert out[11] == '0, "No error"'
    assert out[12] == "(-60.00,-60.00)"  # nothing connected: dark
    assert lab.device("ocs1").model.connections == {}


def raw_tl1(address: str, commands: list[bytes]) -> list[str]:
    host, port = address.removeprefix("tcp://").split(":")
    replies = []
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        for command in commands:
            sock.sendall(command)
            ctag = (command.decode().split(":") + [""] * 4)[3].strip(";") or "0"
            # Read up to the end of this command's response block; autonomous reports that
            # came first are kept in front of it.
            done = re.compile(rf"M  {ctag} (COMPLD|DENY)[^;]*;")
            data = b""
            while not done.search(data.decode("latin-1")):
                chunk = sock.recv(65536)
                assert chunk, "connection closed"
                data += chunk
            replies.append(data.decode())
    return replies


async def test_raw_socket_tl1_session_against_polatis(lab: EmulatedLab) -> None:
    commands = [
        b"RTRV-PATCH:::1:;\r\n",  # before login
        b"ACT-USER::admin:2::wrong;\r\n",
        b"act-user::admin:3::root;",  # lower case, nothing after the ';'
        b"ENT-PATCH::1&2,17&18:4:;\n",
        b"RTRV-PATCH:::5:;\r\n",
        b"ENT-PATCH::1,99:6:;\r\n",  # bad port
        b"ENT-PATCH::3,17:7:;\r\n",  # port 17 is busy
        b"DLT-PATCH::1:8:;\r\n",
        b"RTRV-PATCH:\"( nil )\"::9:;\r\n",
        b"FOO-BAR:::10:;\r\n",
        b"RTRV-PORT-POWER::17&18:11:;\r\n",
        b"DLT-PATCH::ALL:12:;\r\n",
        b"RTRV-PATCH:::13:;\r\n",
    ]
    replies = await asyncio.to_thread(raw_tl1, lab.endpoints["ocs1"]["tl1"], commands)
    assert "M  1 DENY" in replies[0] and "Not logged in" in replies[0]
    assert "M  2 DENY" in replies[1] and "PICC" in replies[1]
    assert "M  3 COMPLD" in replies[2]
    assert re.search(r"\r\n\n   \( nil \) \d\d-\d\d-\d\d \d\d:\d\d:\d\d\r\nM  3 COMPLD", replies[2])
    assert "M  4 COMPLD" in replies[3]
    assert '   "1,17"\r\n   "2,18"\r\n;' in replies[4]
    assert "M  6 DENY\r\n   IIAC\r\n   /* " in replies[5]
    assert "M  7 DENY" in replies[6] and "already connected" in replies[6]
    assert "M  8 COMPLD" in replies[7]
    # An autonomous report of our own patch change may precede the response block.
    assert '"2,18"' in replies[8] and '"1,17"' not in replies[8].split("M  9")[1]
    assert "M  10 DENY\r\n   IICM" in replies[9]
    assert re.search(r'"17:-60.00"\r\n   "18:-4.20"', replies[10])
    assert "M  12 COMPLD" in replies[11]
    assert replies[12].split("M  13 COMPLD")[1].strip() == ";"


async def test_raw_socket_tl1_session_against_calient(lab: EmulatedLab) -> None:
    commands = [
        b"ACT-USER::admin:1::secret;",
        b"ENT-CRS::1.1.1,1.1.2:2::SYSTEM,2WAY;",
        b"RTRV-CRS:::3;",
        b"ACT-CRS::::1.1.1-1.1.2;",  # the short form, by connection name
        b"RTRV-CRS:::5;",
        b"ENT-CRS::1.1.1,1.1.3:6::SYSTEM,2WAY;",
        b"CANC-CRS::1.1.1,1.1.2:7::1.1.1-1.1.2;",
        b"DLT-CRS::1.1.1,1.1.2:8::,SYSTEM,1.1.1-1.1.2;",
        b"RTRV-CRS:::9;",
    ]
    replies = await asyncio.to_thread(raw_tl1, lab.endpoints["cal"]["tl1"], commands)
    assert "M  2 COMPLD" in replies[1]
    assert "AS=UMA,OS=RDY" in replies[2] and "CONNNAME=1.1.1-1.1.2" in replies[2]
    assert "COMPLD" in replies[3]
    assert "AS=IS,OS=IS" in replies[4]
    assert "DENY" in replies[5] and "Invalid Connection" in replies[5]
    assert "M  7 COMPLD" in replies[6] and "M  8 COMPLD" in replies[7]
    assert replies[8].split("M  9 COMPLD")[1].strip() == ";"
    changes = lab.truth("cal")["changes"]
    assert [c["op"] for c in changes] == ["act-crs", "canc-crs"]


def serial_session(path: str) -> list[bytes]:
    with serial.Serial(path, 38400, timeout=3) as port:
        out = []
        for command in (b"*IDN?\r\n", b":OXC:SWIT:CONN:ADD (@1),(@9);*OPC?\r\n",
                        b":OXC:SWIT:CONN:STAT?\n"):
            port.write(command)
            out.append(port.read_until(b"\r\n"))
        return out


async def test_pyserial_on_the_pty(lab: EmulatedLab) -> None:
    path = lab.endpoints["ocspty"]["scpi"].removeprefix("serial://")
    assert path.startswith("/dev/pts/")
    out = await asyncio.to_thread(serial_session, path)
    assert out == [b"Polatis,N-OST-8x8-LA1-DMHNS,002414,6.5.2.18\r\n", b"1\r\n",
                   b"(@1),(@9)\r\n"]


@pytest.mark.parametrize(
    ("options", "stat", "err", "port"),
    [({"joined_replies": False, "port_quotes": False, "error_format": '{signed},"{text}"'},
      "(@1),(@17)\r\n1\r\n", b'+0,"No error"\r\n', b"17\r\n")],
)
async def test_polatis_options_for_unconfirmed_behaviour(options: dict, stat: str, err: bytes,
                                                         port: bytes) -> None:
    async with EmulatedLab([EmulatorSpec("x", "polatis", options, {"technology": "ideal"})],
                           control=False) as emulated:
        host, p = emulated.endpoints["x"]["scpi"].removeprefix("tcp://").split(":")
        reader, writer = await asyncio.open_connection(host, int(p))
        writer.write(b":OXC:SWIT:CONN:ADD (@1),(@17);:OXC:SWIT:CONN:STAT?;*OPC?\n")
        got = await reader.readuntil(b"1\r\n")
        assert got.decode() == stat
        writer.write(b":SYST:ERR?\n:OXC:SWIT:CONN:PORT? 1\n")
        assert await reader.readuntil(b"\r\n") == err
        assert await reader.readuntil(b"\r\n") == port
        writer.close()
