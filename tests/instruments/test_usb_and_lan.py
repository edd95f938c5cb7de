"""Meters as their users reach them: a Keysight over VISA's ``TCPIP::…::INSTR`` (HiSLIP,
through pyvisa-py, against the emulator's HiSLIP server) and a PM100 through the kernel's
``/dev/usbtmc*`` (played on a pty: no CI machine has a USB meter)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pyvisa

from emulators.lab import EmulatedLab, EmulatorSpec, OpticsSpec, ServeSpec
from emulators.physics.optics import EndpointSpec, FiberSpec
from emulators.wire import hislip
from emulators.wire.faults import parse_fault
from instruments.address import parse_address
from instruments.errors import AddressError, ConnectError, InstrumentTimeout
from instruments.keysight import KeysightN77xx
from instruments.thorlabs import ThorlabsPM100
from tests.labs import meter, metered, switch
from tests.rigs import StartRig

WIRING = OpticsSpec([EndpointSpec("tx1", 0.0), EndpointSpec("tx2", 0.0)],
                    [FiberSpec("tx1", "pm1:1", 1.0), FiberSpec("tx2", "pm2:1", 2.0)])


@pytest.fixture
async def lab() -> AsyncIterator[EmulatedLab]:
    specs = [EmulatorSpec("pm1", "keysight", {"noise_db": 0.0}, {},
                          {"scpi": ServeSpec(serve="hislip")}),
             EmulatorSpec("pm2", "thorlabs", {"noise_db": 0.0}, {},
                          {"scpi": ServeSpec(serve="pty")})]
    async with EmulatedLab(specs, optics=WIRING) as emulated:
        yield emulated


def with_pyvisa(resource: str) -> dict[str, Any]:
    """What a user's script does with pyvisa-py: queries, the status byte and a device
    clear on the async channel, then another query on the same session."""
    res: Any = pyvisa.ResourceManager("@py").open_resource(resource)
    try:
        res.timeout = 5000
        res.read_termination = "\n"
        out = {"idn": res.query("*IDN?"), "dbm": float(res.query(":READ1:CHAN1:POW?"))}
        out["stb"] = res.read_stb()
        res.clear()
        out["errors"] = res.query(":SYST:ERR?")
        return out
    finally:
        res.close()


async def test_pyvisa_speaks_hislip_to_the_emulated_keysight(lab: EmulatedLab) -> None:
    address = lab.endpoints["pm1"]["scpi"]
    assert address.startswith("visa://TCPIP::127.0.0.1::hislip0,")
    said = await asyncio.to_thread(with_pyvisa, address.removeprefix("visa://"))
    assert said["idn"].startswith("Keysight Technologies,N774")
    assert said["dbm"] == pytest.approx(-1.0, abs=0.01)  # 0 dBm through 1 dB of fibre
    assert said["stb"] == 0 and said["errors"].startswith("+0")


async def test_labds_keysight_driver_over_visa_tcpip_instr(lab: EmulatedLab) -> None:
    async with KeysightN77xx(lab.endpoints["pm1"]["scpi"], name="pm1") as pm:
        assert await pm.read_power(1) == pytest.approx(-1.0, abs=0.01)
        assert await pm.read_power(2) < -80  # nothing on channel 2
        # The device says nothing: a timeout, as over a socket.
        lab.device("pm1").faults.add(parse_fault({"kind": "stall", "count": 1}))
        with pytest.raises(InstrumentTimeout):
            await pm.read_power(1)


async def test_hostile_hislip_is_refused_and_the_server_serves_on(lab: EmulatedLab) -> None:
    host, port = "127.0.0.1", int(lab.endpoints["pm1"]["scpi"].split(",")[1].split("::")[0])

    def exchange(data: bytes) -> bytes:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(data)
            header = b""
            while len(header) < hislip.HEADER.size:
                chunk = sock.recv(hislip.HEADER.size - len(header))
                if not chunk:
                    break
                header += chunk
            return header

    # Not HiSLIP at all: a FatalError, then the connection is closed.
    reply = await asyncio.to_thread(exchange, b"*IDN?\n" + b"\0" * 10)
    assert reply[:3] == b"HS" + bytes([hislip.FATAL_ERROR])
    # An AsyncInitialize for a session nobody opened: a FatalError too.
    reply = await asyncio.to_thread(exchange, hislip.packet(hislip.ASYNC_INITIALIZE, 0, 999))
    assert reply[:3] == b"HS" + bytes([hislip.FATAL_ERROR])
    # A message longer than the emulator takes (a terabyte, it says): an Error, and the
    # channel is closed rather than read past it.
    huge = struct.pack("!2sBBIQ", b"HS", hislip.INITIALIZE, 0, 0, 1 << 40)
    reply = await asyncio.to_thread(exchange, huge)
    assert reply[:4] == b"HS" + bytes([hislip.ERROR, hislip.TOO_LARGE])
    # A message spread over many Data packets is held to the same limit as one packet:
    # refused once it passes it, and the channel closed (the emulator holds no more).
    def flood() -> list[bytes]:
        headers = []
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(hislip.packet(hislip.INITIALIZE, 0, 0x0100_0000, b"hislip0"))
            # Two packets of 40 kB: neither too long alone, 80 kB together.
            sock.sendall(hislip.packet(hislip.DATA, 0, 0, b"x" * 40_000) * 2)
            stream = sock.makefile("rb")
            while header := stream.read(hislip.HEADER.size):
                headers.append(header)
                stream.read(hislip.HEADER.unpack(header)[4])
        return headers

    kinds = [h[2] for h in await asyncio.to_thread(flood)]
    assert kinds == [hislip.INITIALIZE_RESPONSE, hislip.ERROR]
    said = await asyncio.to_thread(with_pyvisa, lab.endpoints["pm1"]["scpi"][len("visa://"):])
    assert said["idn"].startswith("Keysight Technologies")


def test_usbtmc_addresses_are_checked() -> None:
    assert parse_address("usbtmc:///dev/usbtmc0").target == "/dev/usbtmc0"
    for bad in ("usbtmc://dev/usbtmc0", "usbtmc:///dev/usbtmc0?baud=9600", "usbtmc://"):
        with pytest.raises(AddressError, match="usbtmc:///dev/usbtmc0"):
            parse_address(bad)


async def test_thorlabs_driver_over_usbtmc_reads_power(lab: EmulatedLab) -> None:
    pty = lab.endpoints["pm2"]["scpi"].removeprefix("serial://")
    async with ThorlabsPM100(f"usbtmc://{pty}", name="pm2") as pm:
        assert await pm.read_power() == pytest.approx(-2.0, abs=0.01)
        # The device says nothing: a timeout within the read's own limit.
        lab.device("pm2").faults.add(parse_fault({"kind": "stall", "count": 1}))
        with pytest.raises(InstrumentTimeout):
            await pm.read_power()
    async with ThorlabsPM100(f"usbtmc://{pty}", name="pm2") as pm:
        assert await pm.read_power() == pytest.approx(-2.0, abs=0.01)


async def test_a_missing_usbtmc_device_says_what_to_check(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match="usbtmc driver loaded"):
        async with ThorlabsPM100(f"usbtmc://{tmp_path}/usbtmc9", name="pm"):
            pass


async def test_a_lab_serves_its_meter_over_hislip_and_the_daemon_reads_it(
        start_rig: StartRig) -> None:
    """``serve = "hislip"``: the daemon reaches the emulated meter as it would a LAN
    instrument, through VISA, and verifies light with it."""
    parts = (switch(), meter(emulator={"serve": "hislip", "options": {"noise_db": 0.0}}),
             metered("a", "b", 1, 9, 1))
    async with start_rig("hislip", *parts, token="t", light_window_s=0.5) as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url,
                              headers={"Authorization": "Bearer t"}) as http:
        assert rig.addresses["pm1"].startswith("visa://TCPIP::127.0.0.1::hislip0,")
        r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
        result = r.json()
        assert result["outcome"] == "ok" and result["phases"]["light"] is not None, result


def test_hislip_is_for_scpi_instruments_only(tmp_path: Path) -> None:
    from labd.emulation.emulators import emulated_lab
    from labd.errors import LabFileError
    from labd.lab.loader import load_lab
    from tests.labs import write_lab

    tl1 = switch(driver="polatis-tl1", user="admin", password="root").replace(
        "[instrument.emulator]", "") + '[instrument.emulator]\nserve = "hislip"\n'
    _, path = write_lab(tmp_path, "tl1", tl1)
    with pytest.raises(LabFileError, match=r"id 'ocs1'.*hislip.*SCPI instruments"):
        emulated_lab(load_lab(path))


def spare_loopback_port_111() -> bool:
    """Whether VXI-11's portmapper can have port 111 on 127.0.0.2 here (root, and free)."""
    try:
        with socket.create_server(("127.0.0.2", 111)):
            return True
    except OSError:
        return False


needs_port_111 = pytest.mark.skipif(
    not spare_loopback_port_111(),
    reason="VXI-11's portmapper needs port 111 on 127.0.0.2: root, and nothing there")


@needs_port_111
async def test_pyvisa_and_labds_driver_speak_vxi11_to_the_emulated_keysight() -> None:
    specs = [EmulatorSpec("pm1", "keysight", {"noise_db": 0.0}, {},
                          {"scpi": ServeSpec(serve="vxi11")})]
    async with EmulatedLab(specs, optics=WIRING) as lab:
        address = lab.endpoints["pm1"]["scpi"]
        assert address == "visa://TCPIP::127.0.0.2::inst0::INSTR"
        said = await asyncio.to_thread(with_pyvisa, address.removeprefix("visa://"))
        assert said["idn"].startswith("Keysight Technologies,N774")
        assert said["dbm"] == pytest.approx(-1.0, abs=0.01)
        assert said["stb"] == 0 and said["errors"].startswith("+0")
        async with KeysightN77xx(address, name="pm1") as pm:
            assert await pm.read_power(1) == pytest.approx(-1.0, abs=0.01)


@needs_port_111
async def test_hostile_rpc_is_refused_and_the_vxi11_server_serves_on() -> None:
    from emulators.wire import vxi11

    specs = [EmulatorSpec("pm1", "keysight", {}, {}, {"scpi": ServeSpec(serve="vxi11")})]
    async with EmulatedLab(specs) as lab:
        def call(port: int, body: bytes, *, header: bytes | None = None) -> bytes:
            with socket.create_connection(("127.0.0.2", port), timeout=5) as sock:
                sock.sendall(header if header is not None else
                             struct.pack(">I", 0x8000_0000 | len(body)) + body)
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
                    if len(reply) >= 4 and len(reply) >= 4 + (
                            struct.unpack(">I", reply[:4])[0] & 0x7FFF_FFFF):
                        break
                return reply

        def rpc(program: int, version: int, procedure: int, args: bytes) -> bytes:
            return struct.pack(">10I", 7, 0, 2, program, version, procedure, 0, 0, 0, 0) + args

        # GETPORT says where the core channel is; an unknown procedure and arguments cut
        # short are refused by the RPC layer's own codes.
        port = struct.unpack(">I", (await asyncio.to_thread(call, 111, rpc(
            vxi11.PORTMAPPER, 2, vxi11.GETPORT,
            struct.pack(">4I", vxi11.CORE, 1, 6, 0))))[-4:])[0]
        assert port > 0
        accept = await asyncio.to_thread(call, port, rpc(vxi11.CORE, 1, 99, b""))
        assert struct.unpack(">I", accept[-4:])[0] == vxi11.PROC_UNAVAIL
        short = await asyncio.to_thread(call, port, rpc(vxi11.CORE, 1, vxi11.DEVICE_WRITE,
                                                        b"\0\0"))
        assert struct.unpack(">I", short[-4:])[0] == vxi11.GARBAGE_ARGS
        # A record that says it is a gigabyte long: the connection is closed, not read.
        assert await asyncio.to_thread(call, port, b"", header=struct.pack(
            ">I", 0x8000_0000 | (1 << 30))) == b""
        said = await asyncio.to_thread(with_pyvisa, lab.endpoints["pm1"]["scpi"][7:])
        assert said["idn"].startswith("Keysight Technologies")
