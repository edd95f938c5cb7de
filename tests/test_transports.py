"""The three transports against real peers: TCP, a pty through pyserial, VISA (pyvisa-py)."""

import pytest

from emulators import EmulatedLab
from instruments.errors import ConnectError, InstrumentTimeout
from instruments.link import Link, LinkSettings
from instruments.polatis_scpi import PolatisScpi


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
