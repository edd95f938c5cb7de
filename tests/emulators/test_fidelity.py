"""Fidelity to the documented bytes: every command docs/protocols.md documents for a device,
sent byte for byte to that device's emulator over a real TCP socket (a real pty for the
serial devices), and the documented answer checked: the exact bytes where the reference
gives them, a shape where it gives one. One row per documented command and form; every row
cites its section. Where a fact is tagged [?], the emulator makes it an option and both
forms have a row (``note`` names the option).

The tables are counted in docs/emulators.md ("Fidelity"):
``.venv/bin/python -m tests.emulators.test_fidelity`` prints the counts. How an answer is
taken off the wire: tests/emulators/fidelity.py.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from emulators import EmulatedLab, EmulatorSpec
from emulators.lab import ServeSpec
from tests.emulators.fidelity import (
    CRLF,
    LineProtocol,
    Row,
    Rx,
    Tl1Protocol,
    Wire,
    compld,
    connections,
    deny,
    fail,
    holds,
    matches,
    meter_fault,
    port_states,
    report,
    restore,
    row,
    shape,
    tl1,
)

PROTOCOLS_MD = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"

# -- §1.1 Polatis SCPI (16x16: ingress 1-16, egress 17-32) -------------------------------

IDN = b"Polatis,N-OST-16x16-LA1-DMHNS,002414,6.5.2.18\r\n"
NO_ERROR = b'0, "No error"\r\n'
ADD_1_17 = b":OXC:SWIT:CONN:ADD (@1),(@17)\n"
ADD_12_1718 = b":OXC:SWIT:CONN:ADD (@1,2),(@17,18)\n"
DIS_3 = b":OXC:SWIT:PORT:DIS (@3)\n"
ROUND_TRIP = "`<change>;*OPC?;:SYST:ERR?`"
PORT_Q = "`:OXC:SWIT:CONN:PORT? <p>`"
ERR_FORMAT = '`<code>, "<text>"` error entries'

POLATIS_SCPI: list[Row] = [
    row("1.1", "`*IDN?`", b"*IDN?\n", IDN),
    row("0.1", "command + LF (a CR before the LF ignored)", b"*IDN?\r\n", IDN),
    row("1.1", "`:OXC:SWIT:SIZE?`", b":OXC:SWIT:SIZE?\n", b"16,16\r\n"),
    row("1.1", "`:OXC:SWIT:SIZE?`", b":OXC:SWIT:SIZE?\n", b"8,24\r\n", "an 8x24",
        options={"size": "8x24"}),
    row("1.1", "`:OXC:SWIT:CONN:STAT?`", b":OXC:SWIT:CONN:STAT?\n", b"(@),(@)\r\n", "empty"),
    row("1.1", "`:OXC:SWIT:CONN:STAT?`", b":OXC:SWIT:CONN:STAT?\n", b"(@1,2),(@17,18)\r\n",
        before=(ADD_12_1718,)),
    row("1.1", "`:OXC:SWIT:CONN:ADD <in>,<out>`", ADD_12_1718, b"",
        then=connections({1: 17, 2: 18})),
    row("1.1", "`:OXC:SWIT:CONN:SUB <in>,(@)`", b":OXC:SWIT:CONN:SUB (@1),(@)\n", b"",
        before=(ADD_12_1718,), then=connections({2: 18})),
    row("1.1", "`:OXC:SWIT:CONN:ONLY <in>,<out>`", b":OXC:SWIT:CONN:ONLY (@2,3),(@18,19)\n",
        b"", before=(ADD_12_1718,), then=connections({2: 18, 3: 19})),
    row("1.1", "`:OXC:SWIT:PORT:STAT? [<list>]`", b":OXC:SWIT:PORT:STAT? (@1,2,3)\n",
        b"(E,E,D)\r\n", before=(DIS_3,)),
    row("1.1", "`:OXC:SWIT:PORT:STAT? [<list>]`", b":OXC:SWIT:PORT:STAT?\n",
        b"(" + b",".join([b"E"] * 4 + [b"F"] + [b"E"] * 27) + b")\r\n", "no list: every port",
        before=(fail(5),)),
    row("1.1", "`:OXC:SWIT:PORT:ENAB` / `:DIS <list>`", b":OXC:SWIT:PORT:DIS (@3,4)\n", b"",
        "DIS", then=port_states({3: "D", 4: "D", 5: "E"})),
    row("1.1", "`:OXC:SWIT:PORT:ENAB` / `:DIS <list>`", b":OXC:SWIT:PORT:ENAB (@3)\n", b"",
        "ENAB", before=(b":OXC:SWIT:PORT:DIS (@3,4)\n",), then=port_states({3: "E", 4: "D"})),
    row("1.1", "`:PMON:POW? <list>`", b":PMON:POW? (@1,17,19)\n", b"(-3.00,-4.20,-60.00)\r\n",
        before=(ADD_1_17,)),
    row("1.1", "`:PMON:POW? <list>`", b":PMON:POW? (@17)\n:SYST:ERR?\n",
        b'-113, "Undefined header"\r\n', "absent on I-OST", options={"product": "I-OST"}),
    row("1.1", ROUND_TRIP, b":OXC:SWIT:CONN:ADD (@1,2),(@17,18);*OPC?;:SYST:ERR?\n",
        b'1;0, "No error"\r\n', "the example", then=connections({1: 17, 2: 18})),
    row("1.1", ROUND_TRIP, b":OXC:SWIT:CONN:ADD (@1),(@19);*OPC?;:SYST:ERR?\n",
        b'1;-221, "Settings conflict; port 1 is already connected to 17"\r\n',
        "the example: refused", before=(ADD_12_1718,), then=connections({1: 17, 2: 18})),
    row("1.1", "`:PMON:POW? <list>;:SYST:ERR?`", b":PMON:POW? (@17,18);:SYST:ERR?\n",
        b'(-4.20,-4.20);0, "No error"\r\n', "the example", before=(ADD_12_1718,)),
    row("1.1", "relative header after `;`", b":OXC:SWIT:CONN:ONLY (@1),(@17); stat?\n",
        b"(@1),(@17)\r\n"),
    row("1.1", "keywords case-insensitive, long or short, leading colon optional",
        b"oxc:switch:connect:state?\n", b"(@),(@)\r\n"),
    row("1.1", "channel list `(@)`", b":OXC:SWIT:CONN:ADD (@),(@);:SYST:ERR?\n", NO_ERROR),
    row("1.1", "channel-list ranges `(@1:4)` [?]", b":OXC:SWIT:CONN:ADD (@1:4),(@17:20)\n", b"",
        then=connections({1: 17, 2: 18, 3: 19, 4: 20})),
    row("1.1", "`*OPC?`", b"*OPC?\n", b"1\r\n"),
    row("1.1", "error -113 undefined header", b":FOO:BAR\n:SYST:ERR?\n",
        b'-113, "Undefined header"\r\n'),
    row("1.1", "error -104 bad list", b":OXC:SWIT:CONN:ADD 1,17\n:SYST:ERR?\n",
        b'-104, "Data type error; expected a channel list (@...)"\r\n'),
    row("1.1", "error -108 extra list", b":OXC:SWIT:CONN:ADD (@1),(@17),(@18)\n:SYST:ERR?\n",
        b'-108, "Expected 2 channel list(s)"\r\n'),
    row("1.1", "error -109 missing list", b":OXC:SWIT:CONN:ADD (@1)\n:SYST:ERR?\n",
        b'-109, "Expected 2 channel list(s)"\r\n'),
    row("1.1", "error -222 out of range", b":OXC:SWIT:CONN:ADD (@1),(@40)\n:SYST:ERR?\n",
        b'-222, "Data out of range; port 40 out of range 1..32"\r\n'),
    row("1.1", "error -224 pair on one side", b":OXC:SWIT:CONN:ADD (@1),(@2)\n:SYST:ERR?\n",
        b'-224, "Illegal parameter value; ports 1 and 2 are on the same side"\r\n'),
    row("1.1", "error -224 port reused", b":OXC:SWIT:CONN:ADD (@1,1),(@17,18)\n:SYST:ERR?\n",
        b'-224, "Illegal parameter value; port 1 appears twice"\r\n'),
    row("1.1", "error -240 failed port", b":OXC:SWIT:CONN:ADD (@1),(@17)\n:SYST:ERR?\n",
        b'-240, "Hardware error; port 17 has failed"\r\n', before=(fail(17),),
        then=connections({})),
    row("1.1", "`Q1?;Q2?` on one line [?]", b":OXC:SWIT:SIZE?;*OPC?\n", b"16,16;1\r\n",
        "joined_replies = true"),
    row("1.1", "`Q1?;Q2?` on one line [?]", b":OXC:SWIT:SIZE?;*OPC?\n", b"16,16\r\n1\r\n",
        "joined_replies = false", options={"joined_replies": False}),
    row("1.1", PORT_Q, b":OXC:SWIT:CONN:PORT? 1\n", b'"17"\r\n', "port_quotes = true",
        before=(ADD_1_17,)),
    row("1.1", PORT_Q, b":OXC:SWIT:CONN:PORT? 3\n", b'""\r\n', "port_quotes = true, free",
        before=(ADD_1_17,)),
    row("1.1", PORT_Q, b":OXC:SWIT:CONN:PORT? 1\n", b"17\r\n", "port_quotes = false",
        before=(ADD_1_17,), options={"port_quotes": False}),
    row("1.1", PORT_Q, b":OXC:SWIT:CONN:PORT? 3\n", b"\r\n", "port_quotes = false, free",
        before=(ADD_1_17,), options={"port_quotes": False}),
    row("1.1", "connecting onto a connected port [?]",
        b":OXC:SWIT:CONN:ADD (@3),(@17);*OPC?;:SYST:ERR?\n",
        b'1;-221, "Settings conflict; port 17 is already connected to 1"\r\n',
        "busy_port = deny", before=(ADD_1_17,), then=connections({1: 17})),
    row("1.1", "connecting onto a connected port [?]",
        b":OXC:SWIT:CONN:ADD (@1),(@19);*OPC?;:SYST:ERR?\n", b'1;0, "No error"\r\n',
        "busy_port = replace", before=(ADD_1_17,), options={"busy_port": "replace"},
        then=connections({1: 19})),
    row("1.1", ERR_FORMAT, b":FOO\n:SYST:ERR?\n:SYST:ERR?\n",
        b'-113, "Undefined header"\r\n0, "No error"\r\n', 'error_format = {code}, "{text}"'),
    row("1.1", ERR_FORMAT, b":FOO\n:SYST:ERR?\n:SYST:ERR?\n",
        b'-113,"Undefined header"\r\n+0,"No error"\r\n', 'error_format = {signed},"{text}"',
        options={"error_format": '{signed},"{text}"'}),
    row("1.1", "`*RST`", b"*RST\n", b"", "clears every connection", before=(ADD_12_1718,),
        then=connections({})),
    row("1.1", "`*CLS`", b":FOO\n*CLS\n:SYST:ERR?\n", NO_ERROR),
    row("1.1", "`*STB?`", b"*STB?\n", b"0\r\n"),
    row("1.1", "`*STB?`", b":FOO\n*STB?\n", b"4\r\n", "an error queued"),
    row("1.1", "`:OXC:SWIT:DISC:ALL`", b":OXC:SWIT:DISC:ALL\n", b"", before=(ADD_12_1718,),
        then=connections({})),
    row("1.1", "`:OXC:BOOT:MODE DARK|REST|AUT`", b":OXC:BOOT:MODE?\n", b"DARK\r\n",
        "power-on"),
    row("1.1", "`:OXC:BOOT:MODE DARK|REST|AUT`", b":OXC:BOOT:MODE REST\n:OXC:BOOT:MODE?\n",
        b"REST\r\n", "REST"),
    row("1.1", "`:OXC:BOOT:MODE DARK|REST|AUT`", b":OXC:BOOT:MODE AUT\n:OXC:BOOT:MODE?\n",
        b"AUT\r\n", "AUT"),
    row("1.1", "`:SYST:ERR:ALL?` (format [?])", b":FOO\n:BAR\n:SYST:ERR:ALL?\n",
        b'-113, "Undefined header",-113, "Undefined header"\r\n'),
    row("1.1", "`:SYST:ERR:ALL?` (format [?])", b":SYST:ERR:ALL?\n", NO_ERROR, "empty"),
    row("1.1", "`:SYST:COMM:NETW:ADDR?`", b":SYST:COMM:NETW:ADDR?\n",
        shape(rb'IP="[\d.]+" Gateway="[\d.]+" Mask="[\d.]+" Broadcast="[\d.]+"\r\n')),
    row("1.4", "`polatis-scpi` on `serial://`", b"*IDN?\n", IDN, "a pty: identity",
        serve="pty"),
    row("1.4", "`polatis-scpi` on `serial://`",
        b":OXC:SWIT:CONN:ADD (@1),(@17);*OPC?;:SYST:ERR?\n", b'1;0, "No error"\r\n',
        "a pty: a change", serve="pty", then=connections({1: 17})),
]

# -- §1.2 Polatis TL1 --------------------------------------------------------------------

ENT_1_17 = b"ENT-PATCH::1,17:10:;\r\n"
ENT_12_1718 = b"ENT-PATCH::1&2,17&18:10:;\r\n"
EQPT = "`RTRV-EQPT::SYSTEM:<c>:::PARAMETER=SIZE;`"
SHUTTERS = "`OPR-` / `RLS-PORT-SHUTTER::<ports>:<c>:;`"
TID = "TID: empty or the switch name, bare or quoted"
ENDS = "commands end with `;` plus CR LF, LF or nothing"
PATCHED = "REPT EVT PATCH"
ANY_LINE = Rx(r'[^"\r\n]*')

POLATIS_TL1: list[Row] = [
    row("1.2", "`ACT-USER::<u>:<c>::<pw>;`", b"ACT-USER::admin:1::root;\r\n", tl1(compld("1")),
        login=False),
    row("1.2", "`ACT-USER::<u>:<c>::<pw>;`", b"ACT-USER::admin:2::root;\r\n",
        tl1(deny("2", "SROF", "Already logged in")), '"Already logged in"'),
    row("1.2", "`ACT-USER::<u>:<c>::<pw>;`", b"ACT-USER::admin:1::wrong;\r\n",
        tl1(deny("1", "PICC", "Login failed: invalid user or password")), "wrong password",
        login=False),
    row("1.2", 'anything before login: "Not logged in"', b"RTRV-PATCH:::1:;\r\n",
        tl1(deny("1", "PICC", "Not logged in")), login=False),
    row("1.2", "`RTRV-NETYPE:::<c>:;`", b"RTRV-NETYPE:::2:;\r\n",
        tl1(compld("2", "Polatis,N-OST-16x16-LA1-DMHNS,OCS,6.5.2.18"))),
    row("1.2", "`RTRV-INV::OCS:<c>:;`", b"RTRV-INV::OCS:2:;\r\n",
        tl1(compld("2", Rx(r'[^"\r\n]*SN=002414(?:[,\s][^"\r\n]*)?')))),
    row("1.2", EQPT, b"RTRV-EQPT::SYSTEM:2::PARAMETER=SIZE;\r\n",
        tl1(compld("2", Rx(r'[^"\r\n]*SIZE=16x16(?:[,\s][^"\r\n]*)?'))), "labd's form [?]"),
    row("1.2", EQPT, b"RTRV-EQPT::SYSTEM:2:::PARAMETER=SIZE;\r\n",
        tl1(compld("2", Rx(r'[^"\r\n]*SIZE=16x16(?:[,\s][^"\r\n]*)?'))),
        "public clients' form [?]: an empty block before the keyword"),
    row("1.2", "`RTRV-PATCH:::<c>:;`", b"RTRV-PATCH:::2:;\r\n", tl1(compld("2")), "empty"),
    row("1.2", "`RTRV-PATCH:::<c>:;`", b"RTRV-PATCH:::2:;\r\n",
        tl1(compld("2", "1,17", "2,18")), "the example", before=(ENT_12_1718,)),
    row("1.2", "`ENT-PATCH::<in>,<out>:<c>:;`", b"ENT-PATCH::1,17:3:;\r\n",
        tl1(compld("3"), report("A", PATCHED, "1,17:CONNECTED")), then=connections({1: 17})),
    row("1.2", "`ENT-PATCH::<in>,<out>:<c>:;`", b"ENT-PATCH::1&2,17&18:3:;\r\n",
        tl1(compld("3"), report("A", PATCHED, "1,17:CONNECTED", "2,18:CONNECTED")),
        "`&` lists", then=connections({1: 17, 2: 18})),
    row("1.2", "`ENT-PATCH::<in>,<out>:<c>:;`", b"ENT-PATCH::1,40:3:;\r\n",
        tl1(deny("3", "IIAC", "Invalid AID: port 40 out of range 1..32")), "the example: DENY",
        then=connections({})),
    row("1.2", "`DLT-PATCH::<ports>:<c>:;`", b"DLT-PATCH::1:4:;\r\n",
        tl1(compld("4"), report("A", PATCHED, "1,17:DISCONNECTED")), "an ingress port",
        before=(ENT_12_1718,), then=connections({2: 18})),
    row("1.2", "`DLT-PATCH::<ports>:<c>:;`", b"DLT-PATCH::18:4:;\r\n",
        tl1(compld("4"), report("A", PATCHED, "2,18:DISCONNECTED")), "an egress port",
        before=(ENT_12_1718,), then=connections({1: 17})),
    row("1.2", "`RTRV-PORT-SHUTTER::<ports>:<c>:;`", b"RTRV-PORT-SHUTTER::3:2:;\r\n",
        tl1(compld("2", "3:OPEN"))),
    row("1.2", "`RTRV-PORT-SHUTTER::<ports>:<c>:;`", b"RTRV-PORT-SHUTTER::1&&3:2:;\r\n",
        tl1(compld("2", "1:OPEN", "2:CLOSED", "3:FAILED")), "a range AID; CLOSED; FAILED [L]",
        before=(fail(3), b"OPR-PORT-SHUTTER::2:10:;\r\n")),
    row("1.2", SHUTTERS, b"OPR-PORT-SHUTTER::3&4:2:;\r\n", tl1(compld("2")), "OPR",
        then=port_states({3: "D", 4: "D", 5: "E"})),
    row("1.2", SHUTTERS, b"RLS-PORT-SHUTTER::3:2:;\r\n", tl1(compld("2")),
        "RLS: no port alarm for a shutter", before=(b"OPR-PORT-SHUTTER::3&4:10:;\r\n",),
        then=port_states({3: "E", 4: "D"})),
    row("1.2", "`RTRV-PORT-POWER::<ports>:<c>:;`", b"RTRV-PORT-POWER::1&17&18:2:;\r\n",
        tl1(compld("2", "1:-3.00", "17:-4.20", "18:-60.00")), before=(ENT_1_17,)),
    row("1.2", "`RTRV-PORT-POWER::<ports>:<c>:;`", b"RTRV-PORT-POWER::17:2:;\r\n",
        tl1(deny("2", "IICM", "Power monitoring not supported on this switch")), "I-OST",
        options={"product": "I-OST"}),
    row("1.2", TID, b"RTRV-HDR:OCS-A::2:;\r\n", tl1(compld("2", sid="OCS-A")), "bare",
        options={"sid": "OCS-A"}),
    row("1.2", TID, b'RTRV-HDR:"OCS-A"::2:;\r\n', tl1(compld("2", sid="OCS-A")), "quoted",
        options={"sid": "OCS-A"}),
    row("1.2", TID, b"RTRV-HDR:OTHER::2:;\r\n",
        tl1(deny("2", "IITA", "Invalid target identifier 'OTHER'", sid="OCS-A")),
        "another switch's: IITA", options={"sid": "OCS-A"}),
    row("1.2", ENDS, b"RTRV-HDR:::2:;\r\n", tl1(compld("2")), "CR LF"),
    row("1.2", ENDS, b"RTRV-HDR:::2:;\n", tl1(compld("2")), "LF"),
    row("1.2", ENDS, b"RTRV-HDR:::2:;", tl1(compld("2")), "nothing"),
    row("1.2", "DENY `IICM` unsupported command", b"FOO-BAR:::2:;\r\n",
        tl1(deny("2", "IICM", "Invalid command 'FOO-BAR'"))),
    row("1.2", "DENY `IIAC` bad AID", b"DLT-PATCH::x:2:;\r\n",
        tl1(deny("2", "IIAC", "Invalid AID 'x'"))),
    row("1.2", "DENY `IPNV`", b"RTRV-EQPT::SYSTEM:2::PARAMETER=COLOUR;\r\n",
        tl1(deny("2", "IPNV", Rx(r"Parameter not valid: [^*\r\n]*")))),
    row("1.2", "DENY `IPMS`", b"ENT-PATCH::1:2:;\r\n",
        tl1(deny("2", "IPMS", "ENT-PATCH needs <ingress>,<egress>"))),
    row("1.2", "DENY `IICT` (ctag)", b"RTRV-HDR:::#1:;\r\n",
        tl1(deny("#1", "IICT", "Invalid correlation tag")), ctag="#1"),
    row("1.2", "DENY `SROF` (port busy or failed)", b"ENT-PATCH::3,17:3:;\r\n",
        tl1(deny("3", "SROF", "port 17 is already connected to 1")), "busy_port = deny [?]",
        before=(ENT_1_17,), then=connections({1: 17})),
    row("1.2", "DENY `SROF` (port busy or failed)", b"ENT-PATCH::1,17:3:;\r\n",
        tl1(report("*C", "REPT ALM PORT", "17:CR,PORTFAIL,SA"),
            deny("3", "SROF", "port 17 has failed")), "a failed port", before=(fail(17),)),
    row("1.2", "connecting onto a busy port [?]", b"ENT-PATCH::3,17:3:;\r\n",
        tl1(compld("3"), report("A", PATCHED, "3,17:CONNECTED", "1,17:DISCONNECTED")),
        "busy_port = replace", before=(ENT_1_17,), options={"busy_port": "replace"},
        then=connections({3: 17})),
    row("1.2", "autonomous `REPT ALM PORT`", b"RTRV-PORT-SHUTTER::17:2:;\r\n",
        tl1(report("*C", "REPT ALM PORT", "17:CR,PORTFAIL,SA"), compld("2", "17:FAILED")),
        "a port fails", before=(fail(17),)),
    row("1.2", "autonomous `REPT ALM PORT`", b"RTRV-PORT-SHUTTER::17:2:;\r\n",
        tl1(report("*C", "REPT ALM PORT", "17:CR,PORTFAIL,SA"),
            report("A", "REPT ALM PORT", "17:CL,PORTFAIL,SA"), compld("2", "17:OPEN")),
        "and is restored", before=(fail(17), restore(17))),
    row("1.2", "autonomous messages [?]", b"ENT-PATCH::1,17:3:;\r\n", tl1(compld("3")),
        "autonomous = false", options={"autonomous": False}, then=connections({1: 17})),
    row("1.2", "`OPR-ARC-EQPT::REPMGR:<c>::IND;`",
        b"OPR-ARC-EQPT::REPMGR:2::IND;\r\nENT-PATCH::1,17:3:;\r\n",
        tl1(compld("2"), compld("3")), then=connections({1: 17})),
    row("1.2", "`RLS-ARC-EQPT`", b"RLS-ARC-EQPT::REPMGR:2::IND;\r\nENT-PATCH::1,17:3:;\r\n",
        tl1(compld("2"), compld("3"), report("A", PATCHED, "1,17:CONNECTED")),
        before=(b"OPR-ARC-EQPT::REPMGR:10::IND;\r\n",)),
    row("1.2", "`CANC-USER`", b"CANC-USER::admin:2:;\r\nRTRV-PATCH:::3:;\r\n",
        tl1(compld("2"), deny("3", "PICC", "Not logged in"))),
    row("1.2", "`RTRV-HDR`", b"RTRV-HDR:::2:;\r\n", tl1(compld("2")), "before login",
        login=False),
    row("1.2", "`SET-SID`", b"SET-SID:::2::OCS-B;\r\nRTRV-HDR:::3:;\r\n",
        tl1(compld("2", sid="OCS-B"), compld("3", sid="OCS-B")),
        then=holds("sid OCS-B", lambda d: d.options.sid == "OCS-B")),
    row("1.2", "`INIT-SYS` 0/1", b"INIT-SYS::SYSTEM:2::1;\r\n",
        tl1(compld("2"), report("A", PATCHED, "1,17:DISCONNECTED")), "1",
        before=(ENT_1_17,), then=connections({})),
    row("1.2", "`INIT-SYS` 0/1", b"INIT-SYS::SYSTEM:2::0;\r\n",
        tl1(compld("2"), report("A", PATCHED, "1,17:DISCONNECTED")), "0",
        before=(ENT_1_17, b"OPR-PORT-SHUTTER::3:11:;\r\n"),
        then=holds("no connection, every shutter open", lambda d: not d.model.connections
                   and d.model.state_of(3) == "E")),
]

# -- §2.1 CALIENT TL1 (320 ports, 32 per slot) -------------------------------------------

CAL = "CALIENT"
ENT = b"ENT-CRS::1.1.1,1.1.2:10::SYSTEM,2WAY;\r\n"
ACT = b"ACT-CRS::1.1.1,1.1.2:11:;\r\n"
CANC = b"CANC-CRS::1.1.1,1.1.2:12:;\r\n"
ENT_LISTS = b"ENT-CRS::1.1.1&1.1.3,1.1.2&1.1.4:10::SYSTEM,2WAY;\r\n"
CRS_ACTIVE = ("1.1.1-1.1.2:SRCPORT=1.1.1,DSTPORT=1.1.2,GRPNAME=SYSTEM,CONNNAME=1.1.1-1.1.2,"
              "CONNTYPE=2WAY,AS=IS,OS=IS,OC=OK")
CRS_ENTERED = CRS_ACTIVE.replace("AS=IS,OS=IS", "AS=UMA,OS=RDY")
ENT_CRS = "`ENT-CRS::<src>,<dst>:<c>::<group>,2WAY;`"
ACT_CRS = "`ACT-CRS::<src>,<dst>:<c>:;`"
CANC_CRS = "`CANC-CRS::<src>,<dst>:<c>:;`"
DLT_CRS = "`DLT-CRS::<src>,<dst>:<c>:;`"
RTRV_CRS = "`RTRV-CRS:::<c>:;`"
RTRV_PORT = "`RTRV-PORT::0:<c>:;`"
CAL_LOGIN = "`ACT-USER` answers `COMPLD` or \"Already logged in\""


def _entered(*names: str) -> Any:
    return holds(f"provisioned, not active: {names}", lambda d: sorted(
        c.name for c in d.crs.values() if not c.active) == sorted(names))


def _no_crs(d: Any) -> bool:
    return not d.crs


def _port_rows(count: int, per_slot: int, states: dict[int, str] | None = None) -> list[str]:
    """RTRV-PORT rows: ``1.<slot>.<port>:...`` with the port's state in ``OS=``."""
    out = []
    for n in range(1, count + 1):
        aid = f"1.{(n - 1) // per_slot + 1}.{(n - 1) % per_slot + 1}"
        state = (states or {}).get(n, "IS")
        out.append(Rx(re.escape(aid) + r':[^"\r\n]*\bOS=' + re.escape(state) + r'\b[^"\r\n]*'))
    return out


CALIENT_TL1: list[Row] = [
    row("2.1", CAL_LOGIN, b"ACT-USER::admin:1::pxc***;\r\n", tl1(compld("1", sid=CAL)),
        login=False),
    row("2.1", CAL_LOGIN, b"ACT-USER::admin:2::pxc***;\r\n",
        tl1(deny("2", "SROF", "Already logged in", sid=CAL)), '"Already logged in"'),
    row("2.1", "`RTRV-NE:::<c>:;`", b"RTRV-NE:::2:;\r\n", tl1(compld("2", Rx(
        r'(?=[^"\r\n]*\bCHASSISTYPE=S320\b)(?=[^"\r\n]*\bSERIALNUMBER=CAL-S320-0042\b)'
        r'(?=[^"\r\n]*\bSWPACKAGE=7\.3\.1\b)[^"\r\n]*'), sid=CAL))),
    row("2.1", RTRV_PORT, b"RTRV-PORT::0:2:;\r\n", tl1(compld("2", *_port_rows(320, 32),
                                                           sid=CAL)), "320 ports"),
    row("2.1", RTRV_PORT, b"RTRV-PORT::0:2:;\r\n",
        tl1(compld("2", *_port_rows(4, 32, {2: "OOS-MA", 3: "OOS-AU"}), sid=CAL)),
        "port states [?]: enabled, disabled, failed", options={"ports": 4},
        before=(lambda d: d.model.set_port_state(2, "D"), fail(3))),
    row("2.1", ENT_CRS, b"ENT-CRS::1.1.1,1.1.2:3::SYSTEM,2WAY;\r\n", tl1(compld("3", sid=CAL)),
        "provisioned, no light", then=_entered("1.1.1-1.1.2")),
    row("2.1", ENT_CRS, b"ENT-CRS::1.1.1,1.1.2:3::LAB,1WAY;\r\nRTRV-CRS:::4:;\r\n",
        tl1(compld("3", sid=CAL), compld("4", CRS_ENTERED.replace("-", ">").replace(
            "SYSTEM", "LAB").replace("2WAY", "1WAY"), sid=CAL)), "a group; 1WAY"),
    row("2.1", ENT_CRS, ENT_LISTS.replace(b":10:", b":3:"), tl1(compld("3", sid=CAL)),
        "`&` lists [?] (aid_lists)", then=_entered("1.1.1-1.1.2", "1.1.3-1.1.4")),
    row("2.1", ENT_CRS, b"ENT-CRS::1.1.1,1.1.3:6::SYSTEM,2WAY;\r\n",
        tl1(deny("6", "SROF", "Invalid Connection: port 1.1.1 in use", sid=CAL)),
        "the example: a port in use", before=(ENT,)),
    row("2.1", ENT_CRS, b"ENT-CRS::1.1.1,1.1.2:3::SYSTEM,2WAY;\r\n",
        tl1(deny("3", "SROF", "Failed: port 1.1.2 has failed", sid=CAL)), "a failed port",
        before=(fail(2),)),
    row("2.1", ENT_CRS, b"ENT-CRS::1.1.99,1.1.2:3::SYSTEM,2WAY;\r\n",
        tl1(deny("3", "IIAC", "Invalid AID 1.1.99: no such port", sid=CAL)), "no such port"),
    row("2.1", ACT_CRS, b"ACT-CRS::1.1.1,1.1.2:4:;\r\n", tl1(compld("4", sid=CAL)),
        "by its ports [?]", before=(ENT,), then=connections({1: 2})),
    row("2.1", ACT_CRS, b"ACT-CRS::1.1.1,1.1.2:4::1.1.1-1.1.2,SYSTEM;\r\n",
        tl1(compld("4", sid=CAL)), "public clients: `…::<conn-name>`", before=(ENT,),
        then=connections({1: 2})),
    row("2.1", ACT_CRS, b"ACT-CRS::::1.1.1-1.1.2;\r\n", tl1(compld("0", sid=CAL)),
        "by name alone; an empty ctag answered as 0", before=(ENT,),
        then=connections({1: 2})),
    row("2.1", ACT_CRS, b"ACT-CRS::1.1.1&1.1.3,1.1.2&1.1.4:4:;\r\n", tl1(compld("4", sid=CAL)),
        "`&` lists [?]", before=(ENT_LISTS,), then=connections({1: 2, 3: 4})),
    row("2.1", ACT_CRS, b"ACT-CRS::1.1.1,1.1.2:4:;\r\n",
        tl1(deny("4", "IIAC", "Invalid Connection: no connection 1.1.1,1.1.2", sid=CAL)),
        "nothing entered", then=connections({})),
    row("2.1", CANC_CRS, b"CANC-CRS::1.1.1,1.1.2:5:;\r\n", tl1(compld("5", sid=CAL)),
        "by its ports [?]", before=(ENT, ACT), then=connections({})),
    row("2.1", CANC_CRS, b"CANC-CRS::1.1.1,1.1.2:5::1.1.1-1.1.2;\r\n", tl1(compld("5", sid=CAL)),
        "public clients: `…::<conn-name>`", before=(ENT, ACT), then=_entered("1.1.1-1.1.2")),
    row("2.1", DLT_CRS, b"DLT-CRS::1.1.1,1.1.2:6:;\r\n", tl1(compld("6", sid=CAL)),
        "by its ports [?]", before=(ENT, ACT, CANC), then=holds("no connection", _no_crs)),
    row("2.1", DLT_CRS, b"DLT-CRS::1.1.1,1.1.2:6::,SYSTEM,1.1.1-1.1.2;\r\n",
        tl1(compld("6", sid=CAL)), "public clients: by name; an active one goes dark",
        before=(ENT, ACT), then=holds("no connection, dark",
                                      lambda d: _no_crs(d) and not d.model.connections)),
    row("2.1", RTRV_CRS, b"RTRV-CRS:::5:;\r\n", tl1(compld("5", CRS_ACTIVE, sid=CAL)),
        "the example", before=(ENT, ACT)),
    row("2.1", RTRV_CRS, b"RTRV-CRS:::5:;\r\n", tl1(compld("5", CRS_ENTERED, sid=CAL)),
        "provisioned", before=(ENT,)),
    row("2.1", RTRV_CRS, b"RTRV-CRS:::5:;\r\n", tl1(compld("5", sid=CAL)), "empty"),
    row("2.1", "ports `<shelf>.<slot>.<port>` (`ports_per_slot`)",
        b"ENT-CRS::1.2.1,1.1.2:3::SYSTEM,2WAY;\r\nACT-CRS::1.2.1,1.1.2:4:;\r\n",
        tl1(compld("3", sid=CAL), compld("4", sid=CAL)), "ports_per_slot = 16",
        options={"ports_per_slot": 16}, then=connections({2: 17})),
    row("2.1", "prompt lines such as `agent> ` [D]", b"RTRV-HDR:::2:;\r\n",
        tl1(compld("2", sid=CAL), tail=b"\r\nagent> "), "prompt = agent> ",
        options={"prompt": "agent> "}),
    row("2.1", '"Login Not Active" too soon after login [D]', b"RTRV-NE:::2:;\r\n",
        tl1(deny("2", "SROF", "Login Not Active", sid=CAL)), "login_settle_ms",
        options={"login_settle_ms": 600_000}),
    row("2.1", "`INH-MSG`/`ALW-MSG` (syntax [?]): no-ops", b"INH-MSG:::2:;\r\n",
        tl1(compld("2", sid=CAL)), "INH-MSG"),
    row("2.1", "`INH-MSG`/`ALW-MSG` (syntax [?]): no-ops", b"ALW-MSG:::2:;\r\n",
        tl1(compld("2", sid=CAL)), "ALW-MSG"),
]

# -- §4.1 Keysight N77xx (N7744A: 4 channels) --------------------------------------------

KIDN = b"Keysight Technologies,N7744A,MY12345678,1.220\n"
K_OK = b'+0,"No error"\n'
READING = rb"[+-]\d\.\d{6}E[+-]\d\d"
LOG_10 = (b":SENS1:FUNC:PAR:LOGG 10,0.0001S\n", b":SENS1:FUNC:STAT LOGG,STAR\n")
LOG_LONG = (b":SENS1:FUNC:PAR:LOGG 100,0.1S\n", b":SENS1:FUNC:STAT LOGG,STAR\n")  # 10 s
ATIM = "`:SENS<n>:POW:ATIM?` / `… ATIM <t>S`"
UNIT = "`:SENS<n>:POW:UNIT?` / `… UNIT 0|1`"
WAV = "`:SENS<n>:POW:WAV <nm>NM` / `… WAV?`"
RANG = "`:SENS<n>:POW:RANG <dBm>DBM` / `… RANG:AUTO 1`"
FUNC = "`:SENS<n>:FUNC:STAT LOGG,STOP|STAR`"
STAT = "`:SENS<n>:FUNC:STAT?`"
RES = "`:SENS<n>:FUNC:RES?`"
TRIG = "`:TRIG<n>:INP` `IGN`/`SME`/`CME`/`MME`"


def _channel(channel: int, test: Any, what: str) -> Any:
    return holds(what, lambda d: test(d.meter.state[channel]))


def _log(channel: int, test: Any, what: str) -> Any:
    return holds(what, lambda d: test(d.logs[channel]))


KEYSIGHT: list[Row] = [
    row("4.1", "`*IDN?`", b"*IDN?\n", KIDN),
    row("4.1", "`*IDN?`", b"*IDN?\n", b"Keysight Technologies,N7745A,MY12345678,1.220\n",
        "N7745A", options={"model": "N7745A"}),
    row("4.1", ATIM, b":SENS1:POW:ATIM?\n", b"1.000000E-01\n", "power-on"),
    row("4.1", ATIM, b":SENS2:POW:ATIM 0.001S\n:SENS2:POW:ATIM?\n", b"1.000000E-03\n"),
    row("4.1", UNIT, b":SENS1:POW:UNIT?\n", b"0\n", "power-on: dBm"),
    row("4.1", UNIT, b":SENS3:POW:UNIT 1\n:SENS3:POW:UNIT?\n", b"1\n", "W"),
    row("4.1", UNIT, b":SENS3:POW:UNIT 1\n:SENS3:POW:UNIT 0\n:SENS3:POW:UNIT?\n", b"0\n",
        "dBm again"),
    row("4.1", WAV, b":SENS1:POW:WAV?\n", b"1.55000E-06\n", "power-on: metres"),
    row("4.1", WAV, b":SENS4:POW:WAV 1310NM\n:SENS4:POW:WAV?\n", b"1.31000E-06\n"),
    row("4.1", RANG, b":SENS1:POW:RANG -20DBM;:SYST:ERR?\n", K_OK, "a fixed range",
        then=_channel(1, lambda c: c.range_dbm == -20 and not c.auto_range, "range -20")),
    row("4.1", RANG, b":SENS1:POW:RANG:AUTO 1;:SYST:ERR?\n", K_OK, "auto",
        before=(b":SENS1:POW:RANG -20DBM\n",),
        then=_channel(1, lambda c: c.auto_range, "auto range")),
    row("4.1", "`:READ<n>:POW?`", b":READ1:POW?;:SYST:ERR?\n",
        shape(READING + rb';\+0,"No error"\n'), "the example: dBm"),
    row("4.1", "`:READ<n>:POW?`", b":READ1:POW?\n", shape(rb"\+\d\.\d{6}E-\d\d\n"),
        "in the channel's unit: W", before=(b":SENS1:POW:UNIT 1\n",)),
    row("4.1", "`:READ<n>:POW?`", b":READ1:POW?\n", b"+9.910000E+37\n",
        "over range [?]: overrange = 9.91E37", before=(meter_fault("saturation"),)),
    row("4.1", "`:READ<n>:POW?`", b":READ1:POW?\n", b"+3.400000E+38\n",
        "over range [?]: overrange = 3.4E38", options={"overrange": 3.4e38},
        before=(meter_fault("saturation"),)),
    row("4.1", FUNC, b":SENS1:FUNC:STAT LOGG,STAR;*OPC?;:SYST:ERR?\n", b'1;+0,"No error"\n',
        "STAR", before=(LOG_LONG[0],), then=_log(1, lambda g: g.running, "logging")),
    row("4.1", FUNC, b":SENS1:FUNC:STAT LOGG,STOP;*OPC?;:SYST:ERR?\n", b'1;+0,"No error"\n',
        "STOP", before=LOG_LONG, then=_log(1, lambda g: not g.running, "stopped")),
    row("4.1", "`:SENS<n>:FUNC:PAR:LOGG <N>,<t>S`",
        b":SENS1:FUNC:STAT LOGG,STOP;PAR:LOGG 1000,0.0001S;*OPC?;:SYST:ERR?\n",
        b'1;+0,"No error"\n', "the example",
        then=_log(1, lambda g: (g.points, g.atime_s) == (1000, 1e-4), "1000 x 100 us")),
    row("4.1", "`:SENS<n>:FUNC:PAR:LOGG <N>,<t>S`",
        b":SENS1:FUNC:PAR:LOGG 10,0.0001S;:SYST:ERR?\n",
        b'-221,"Settings conflict; stop the logging function first"\n',
        "not while a function runs", before=LOG_LONG),
    row("4.1", STAT, b":SENS1:FUNC:STAT?\n", b"LOGGING_STABILITY,PROGRESS\n", "PROGRESS",
        before=LOG_LONG),
    row("4.1", STAT, b":SENS1:FUNC:RES?\n:SENS1:FUNC:STAT?\n",
        shape(rb"#240(?s:.{40})\nLOGGING_STABILITY,COMPLETE\n"), "COMPLETE", before=LOG_10),
    row("4.1", STAT, b":SENS1:FUNC:STAT?\n", shape(rb"[A-Z_]+,COMPLETE\n"),
        "setting any property stops a log",
        before=(*LOG_LONG, b":SENS1:POW:WAV 1310NM\n")),
    row("4.1", RES, b":SENS1:FUNC:RES?;:SYST:ERR?\n",
        shape(rb'#44000(?s:.{4000});\+0,"No error"\n'), "the example",
        before=(b":SENS1:FUNC:PAR:LOGG 1000,0.0001S\n", LOG_10[1])),
    row("4.1", RES, b":SENS1:FUNC:RES?;:SYST:ERR?\n",
        b'-230,"Data corrupt or stale; no logging result"\n',
        "refused: the error entry instead of `#`"),
    row("4.1", "channel n after the subsystem", b":SENS9:POW:WAV?;:SYST:ERR?\n",
        b'-114,"Header suffix out of range; channels 1..4"\n', "the example"),
    row("4.1", "channel n after the subsystem", b":SENS8:POW:WAV?\n", b"1.55000E-06\n",
        "N7745A: 1..8", options={"model": "N7745A"}),
    row("4.1", "`:SYST:ERR?`", b":SYST:ERR?\n", K_OK),
    row("4.1", TRIG, b":TRIG1:INP?\n", b"IGN\n", "power-on"),
    row("4.1", TRIG, b":TRIG1:INP SME\n:TRIG1:INP?\n", b"SME\n", "SME"),
    row("4.1", TRIG, b":TRIG1:INP MME\n:TRIG1:INP?\n", b"MME\n", "MME"),
    row("4.1", TRIG, b":SENS1:FUNC:STAT?\n:TRIG\n:SENS1:FUNC:RES?\n",
        shape(rb"LOGGING_STABILITY,PROGRESS\n#240(?s:.{40})\n"), "CME: armed until `:TRIG`",
        before=(b":TRIG1:INP CME\n", *LOG_10)),
    row("4.1", "`:FETC<n>:POW?`", b":FETC1:POW?\n", shape(READING + rb"\n")),
    row("4.1", "`:FETC:POW:ALL?` (block)", b":FETC:POW:ALL?\n", shape(rb"#216(?s:.{16})\n")),
    row("4.1", "`GAIN:AUTO`", b":SENS1:POW:GAIN:AUTO 1;:SENS1:POW:GAIN:AUTO?;:SYST:ERR?\n",
        b'1;+0,"No error"\n'),
    row("4.1", "zeroing", b":SENS1:CORR:COLL:ZERO;:SYST:ERR?\n", K_OK, "one channel"),
    row("4.1", "zeroing", b":SENS:CORR:COLL:ZERO:ALL;:SYST:ERR?\n", K_OK, "all"),
    row("4.1", "`:INIT<n>:IMM|CONT`", b":INIT1:IMM;:INIT1:CONT 1;:SYST:ERR?\n", K_OK),
    row("4.1", "`*ESR?`", b"*ESR?\n", b"0\n"),
    row("4.1", "`*RST`: the power-on settings", b"*RST\n:SENS1:POW:UNIT?;ATIM?;WAV?;RANG:AUTO?\n",
        b"0;1.000000E-01;1.55000E-06;1\n",
        before=(b":SENS1:POW:UNIT 1\n", b":SENS1:POW:ATIM 1S\n", b":SENS1:POW:WAV 1310NM\n",
                b":SENS1:POW:RANG -10DBM\n")),
    row("4.1", "`*RST`: the power-on settings", b"*RST\n:TRIG1:INP?;:SENS1:FUNC:STAT?\n",
        b"IGN;NONE,COMPLETE\n", "the logging function and trigger",
        before=(b":TRIG1:INP SME\n", *LOG_LONG)),
    row("4.1", "`*RST`: the power-on settings", b"*RST\n:READ1:POW?;:SYST:ERR?\n",
        b'-241,"Hardware missing; no sensor"\n', "not the hardware: a missing head stays",
        before=(meter_fault("no_sensor"),)),
]

# -- §4.2 Thorlabs PM100 (PM100D, S122C head 700-1800 nm) --------------------------------

TIDN = b"Thorlabs,PM100D,P0012345,2.8.0\n"
T_OK = b'0,"No error"\n'
T_UNIT = "`:SENS:POW:UNIT?` / `… UNIT W|DBM`"
T_WAV = "`:SENS:CORR:WAV <nm>` / `… WAV?` / `… WAV? MIN|MAX`"
T_AVER = "`:SENS:AVER:COUN?` / `… COUN <n>`"

THORLABS: list[Row] = [
    row("4.2", "`*IDN?`", b"*IDN?\n", TIDN),
    row("4.2", "`:SYST:SENS:IDN?`", b":SYST:SENS:IDN?\n",
        b"S122C,21031234,01-Jan-2024,1,18,289\n", "the example"),
    row("4.2", "`:SYST:SENS:IDN?`", b":SYST:SENS:IDN?\n", shape(rb"no sensor(,[^,\n]*){5}\n"),
        "no head", before=(meter_fault("no_sensor"),)),
    row("4.2", T_AVER, b":SENS:AVER:COUN?\n", b"1\n", "power-on"),
    row("4.2", T_AVER, b":SENS:AVER:COUN 10\n:SENS:AVER:COUN?\n", b"10\n"),
    row("4.2", T_UNIT, b":SENS:POW:UNIT?\n", b"W\n", "power-on: W"),
    row("4.2", T_UNIT, b":SENS:POW:UNIT DBM\n:SENS:POW:UNIT?\n", b"DBM\n"),
    row("4.2", T_UNIT, b":SENS:POW:UNIT DBM\n:SENS:POW:UNIT W\n:SENS:POW:UNIT?\n", b"W\n",
        "W again"),
    row("4.2", "`:MEAS:POW?`", b":MEAS:POW?\n", shape(rb"\d\.\d{6}E[+-]\d\d\n"),
        "power-on: W"),
    row("4.2", "`:MEAS:POW?`", b":MEAS:POW?;:SYST:ERR?\n",
        shape(rb'-\d\.\d{6}E\+\d\d;0,"No error"\n'), "the example: dBm",
        before=(b":SENS:POW:UNIT DBM\n",)),
    row("4.2", "`:MEAS:POW?`", b":MEAS:POW?;:SYST:ERR?\n", b'-241,"Hardware missing; no sensor"\n',
        "no head: -241", before=(meter_fault("no_sensor"),)),
    row("4.2", T_WAV, b":SENS:CORR:WAV 1550\n:SENS:CORR:WAV?\n", b"1.550000E+03\n"),
    row("4.2", T_WAV, b":SENS:CORR:WAV? MIN\n:SENS:CORR:WAV? MAX\n",
        b"7.000000E+02\n1.800000E+03\n", "the head's range"),
    row("4.2", T_WAV, b":SENS:CORR:WAV? MIN\n:SENS:CORR:WAV? MAX\n",
        b"4.000000E+02\n1.100000E+03\n", "sensor_min_nm, sensor_max_nm",
        options={"sensor_min_nm": 400.0, "sensor_max_nm": 1100.0}),
    row("4.2", T_WAV, b":SENS:CORR:WAV 2000;:SYST:ERR?\n",
        b'-222,"Data out of range; the sensor covers 700-1800 nm"\n', "outside the head: -222"),
    row("4.2", "`:SENS:CORR:COLL:ZERO:INIT`", b":SENS:CORR:COLL:ZERO:INIT;:SYST:ERR?\n", T_OK),
    row("4.2", "`READ?`", b":READ?\n", shape(rb"\d\.\d{6}E[+-]\d\d\n")),
    row("4.2", "`FETC?`", b":FETC?\n", shape(rb"\d\.\d{6}E[+-]\d\d\n")),
    row("4.2", "`CONF:POW`", b":CONF:POW;:SYST:ERR?\n", T_OK),
    row("4.2", "`INIT`", b":INIT;:SYST:ERR?\n", T_OK),
    row("4.2", "`:SENS:POW:RANG:AUTO`", b":SENS:POW:RANG:AUTO 1;:SENS:POW:RANG:AUTO?;:SYST:ERR?\n",
        b'1;0,"No error"\n'),
    row("4.2", "`ZERO:MAGN?`", b":SENS:CORR:COLL:ZERO:MAGN?\n", shape(rb"\d\.\d{6}E[+-]\d\d\n")),
    row("4.2", "`MEAS:ENER?` (-241)", b":MEAS:ENER?;:SYST:ERR?\n",
        b'-241,"Hardware missing; not an energy sensor"\n'),
    row("4.2", "`*RST`: the power-on settings", b"*RST\n:SENS:POW:UNIT?;:SENS:AVER:COUN?\n",
        b"W;1\n", before=(b":SENS:POW:UNIT DBM\n", b":SENS:AVER:COUN 10\n")),
    row("4.2", "`*RST`: the power-on settings", b"*RST\n:MEAS:POW?;:SYST:ERR?\n",
        b'-241,"Hardware missing; no sensor"\n', "not the hardware: a missing head stays",
        before=(meter_fault("no_sensor"),)),
]

# -- §5.1 Qontrol (an 8x8 mesh: 20 heaters, three Q8iv modules, 24 channels) ------------

OPENED = "`E90:00` when the port opens"
V_SET = "`v<ch>=<V>` / `vvec<ch0>=v0,v1,…`"
I_SET = "`i<ch>=<mA>` / `ivec<ch0>=…`"
READ_ALL = "`vall?` / `iall?`"
VMAX = "`vmax<ch>=<V>` / `vmax<ch>?`"
IMAX = "`imax<ch>=<mA>` / `imax<ch>?`"
ERRORS = "errors `E<nn>:<ch>`"


def _levels(values: dict[int, float], default: float = 0.0) -> bytes:
    return b"".join(f"{values.get(ch, default):.4f}\n".encode() for ch in range(24))


def _volts(expected: dict[int, float]) -> Any:
    return holds(f"volts {expected}", lambda d: all(d.volts[c] == v for c, v in expected.items()))


def _currents(expected: dict[int, float]) -> Any:
    return holds(f"currents {expected}",
                 lambda d: all(d.current[c] == v for c, v in expected.items()))


QONTROL: list[Row] = [
    row("5.1", OPENED, b"", b"E90:00\n", "powered_up = true", opening=True),
    row("5.1", OPENED, b"", b"E90:0\n", "error_padding = false [?]", opening=True,
        options={"error_padding": False}),
    row("5.1", OPENED, b"", b"", "powered_up = false", opening=True,
        options={"powered_up": False}),
    row("5.1", "`id?`", b"id?\n", b"Q8iv-01A0\n"),
    row("5.1", "`id?`", b"ID?\n", b"Q8iv-01A0\n", "words case-insensitive"),
    row("5.1", "`nchan?`", b"nchan?\n", b"24\n"),
    row("5.1", "`nup=0` / `nupall?`", b"nup=0\n", b"OK\n"),
    row("5.1", "`nup=0` / `nupall?`", b"nupall?\n",
        b"Q8iv-01A0 : 0\nQ8iv-01A1 : 1\nQ8iv-01A2 : 2\n", "one line per module"),
    row("5.1", "`vfull?` / `ifull?`", b"vfull?\n", b"12.0 V\n", "vfull?"),
    row("5.1", "`vfull?` / `ifull?`", b"ifull?\n", b"24.0 mA\n", "ifull?"),
    row("5.1", V_SET, b"v9=1.2000\n", b"OK\n", "ack = true [?]; channel 9: module 1",
        then=_volts({9: 1.2})),
    row("5.1", V_SET, b"v9=1.2000\n", b"", "ack = false [?]", options={"ack": False},
        then=_volts({9: 1.2})),
    row("5.1", V_SET, b"vvec0=0.0000,3.5355\n", b"OK\n", "a run",
        then=_volts({0: 0.0, 1: 3.5355})),
    row("5.1", V_SET, b"vvec0=0.0000,3.5355\nv9=1.2000\nnchan?\n", b"OK\nOK\n24\n",
        "the example", then=_volts({1: 3.5355, 9: 1.2})),
    row("5.1", I_SET, b"i3=1.5\n", b"OK\n", then=_currents({3: 1.5})),
    row("5.1", I_SET, b"ivec2=1.0,2.5\n", b"OK\n", "a run", then=_currents({2: 1.0, 3: 2.5})),
    row("5.1", I_SET, b"i3=1.5\n", b"", "ack = false [?]", options={"ack": False},
        then=_currents({3: 1.5})),
    row("5.1", READ_ALL, b"vall?\n", _levels({}), "power-on"),
    row("5.1", READ_ALL, b"v9=1.2000\nvall?\n", b"OK\n" + _levels({9: 1.2}),
        "one line per channel"),
    row("5.1", READ_ALL, b"i3=1.5\niall?\n", b"OK\n" + _levels({3: 1.5}), "iall?"),
    row("5.1", VMAX, b"vmax3=5\nvmax3?\n", b"OK\n5.0000\n"),
    row("5.1", VMAX, b"vmax3=5\nv3=6\n", b"OK\nE01:03\n", "beyond it: refused, nothing applied",
        then=_volts({3: 0.0})),
    row("5.1", IMAX, b"imax3=10\nimax3?\n", b"OK\n10.0000\n"),
    row("5.1", IMAX, b"imax3=4\nv3=6\n", b"OK\nE02:03\n",
        "beyond it: held at 4 mA x 500 ohm", then=_volts({3: 2.0})),
    row("5.1", ERRORS, b"v3=13\n", b"E01:03\n", "1 over-voltage", then=_volts({3: 0.0})),
    row("5.1", ERRORS, b"v3=13\n", b"E1:3\n", "error_padding = false [?]",
        options={"error_padding": False}),
    row("5.1", ERRORS, b"i3=30\n", b"E02:03\n", "2 over-current"),
    row("5.1", ERRORS, b"foo?\n", b"E10:00\n", "10 unrecognised command"),
    row("5.1", ERRORS, b"v3=abc\n", b"E11:03\n", "11 unrecognised parameter"),
    row("5.1", ERRORS, b"v99=1\n", b"E12:99\n", "12 unrecognised channel"),
]

# -- the tables and how each is spoken ---------------------------------------------------


def _polatis_idn(d: Any) -> bytes:
    return f"{d.idn()}{CRLF}".encode()


SCPI_POLATIS = LineProtocol(b"*IDN?\n", _polatis_idn)
SCPI_METER = LineProtocol(b"*IDN?\n", lambda d: (
    d.idn() if hasattr(d, "idn") else
    f"Thorlabs,{d.options.model},{d.options.serial},{d.options.firmware}").encode() + b"\n")
BOARD = LineProtocol(b"id?\n", lambda d: f"{d.module_id(0)}\n".encode(), before_answer=b"")

#: table name → (emulator kind, interface, protocol, rows, section(s) of its doc tables)
TABLES: dict[str, tuple[str, str, Any, list[Row], tuple[str, ...]]] = {
    "Polatis SCPI": ("polatis", "scpi", SCPI_POLATIS, POLATIS_SCPI, ("1.1",)),
    "Polatis TL1": ("polatis", "tl1", Tl1Protocol(b"ACT-USER::admin:1::root;\r\n"),
                    POLATIS_TL1, ("1.2",)),
    "CALIENT TL1": ("calient", "tl1", Tl1Protocol(b"ACT-USER::admin:1::pxc***;\r\n"),
                    CALIENT_TL1, ("2.1",)),
    "Keysight N77xx": ("keysight", "scpi", SCPI_METER, KEYSIGHT, ("4.1",)),
    "Thorlabs PM100": ("thorlabs", "scpi", SCPI_METER, THORLABS, ("4.2",)),
    "Qontrol": ("mesh", "serial", BOARD, QONTROL, ("5.1",)),
}

CASES = [pytest.param(name, r, id=f"{name}: {r.id}")
         for name, (_, _, _, rows, _) in TABLES.items() for r in rows]


@pytest.mark.parametrize(("table", "r"), CASES)
async def test_documented_bytes(table: str, r: Row) -> None:
    kind, iface, protocol, _, _ = TABLES[table]
    serve = {iface: ServeSpec(serve="pty")} if r.serve == "pty" or kind == "mesh" else {}
    spec = EmulatorSpec("dev", kind, dict(r.options), {"technology": "ideal"}, serve=serve)
    async with EmulatedLab([spec], control=False) as lab:
        device = lab.device("dev")
        loop = asyncio.get_running_loop()

        def converse() -> bytes:
            wire = Wire(lab.endpoints["dev"][iface])
            try:
                got: bytes = protocol.exchange(wire, loop, device, r)
                return got
            finally:
                wire.close()

        got = await asyncio.to_thread(converse)
        assert matches(r.expect, got), (
            f"§{r.section} {r.command}: sent {r.send!r}\n  expected "
            f"{r.expect if isinstance(r.expect, bytes) else r.expect.pattern!r}\n"
            f"  got      {got!r}")
        if r.then is not None:
            assert r.then(device), f"§{r.section} {r.command}: expected {r.then.what}"


# -- the tables against the reference ----------------------------------------------------

def _sections(text: str) -> dict[str, str]:
    """``N.M`` → that section's text in docs/protocols.md."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"#{2,3} (\d+(?:\.\d+)?)\b", line)
        if heading:
            current = heading.group(1)
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def _documented_commands(section_text: str) -> list[str]:
    """The first cells of a section's command tables (the rows whose first cell is code)."""
    cells = []
    for line in section_text.splitlines():
        if line.startswith("| `"):
            cells.append(re.split(r"(?<!\\)\|", line)[1].strip().replace("\\|", "|"))
    return cells


def test_every_documented_command_has_a_row_and_every_row_cites_a_section() -> None:
    sections = _sections(PROTOCOLS_MD.read_text(encoding="utf-8"))
    for name, (_, _, _, rows, documented_in) in TABLES.items():
        commands = {r.command for r in rows}
        for section in documented_in:
            table = _documented_commands(sections[section])
            assert table, f"§{section} has no command table"
            missing = [c for c in table if c not in commands]
            assert not missing, f"{name}: no row for §{section} {missing}"
        for r in rows:
            assert r.section in sections, f"{name}: {r.id} cites §{r.section}, not in the doc"
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "two rows of one table are the same"


def counts() -> list[tuple[str, int, int, int]]:
    """(table, commands of the section's command table, documented commands covered, rows):
    the numbers in docs/emulators.md."""
    sections = _sections(PROTOCOLS_MD.read_text(encoding="utf-8"))
    out = []
    for name, (_, _, _, rows, documented_in) in TABLES.items():
        cells = {c for section in documented_in for c in _documented_commands(sections[section])}
        out.append((name, len(cells), len({r.command for r in rows}), len(rows)))
    return out


if __name__ == "__main__":
    print("| device | command-table entries (all covered) | documented commands covered | rows |")
    print("|---|---|---|---|")
    table = counts()
    for name, cells, commands, rows in table:
        print(f"| {name} | {cells} | {commands} | {rows} |")
    print(f"| all | {sum(t[1] for t in table)} | {sum(t[2] for t in table)} | "
          f"{sum(t[3] for t in table)} |")
