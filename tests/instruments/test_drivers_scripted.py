"""Protocol tests per driver: exact bytes out, scripted bytes back, including malformed
replies and a device that stops answering."""

import pytest

from instruments import (
    DeviceError,
    InstrumentTimeout,
    NotSupported,
    ProtocolError,
)
from instruments.calient import CalientTl1
from instruments.connection import Backoff
from instruments.errors import InstrumentClosed, InvalidRequest
from instruments.events import EventQueue, LinkState
from instruments.link import LinkSettings
from instruments.polatis_scpi import PolatisScpi
from instruments.polatis_tl1 import PolatisTl1
from tests.scripted import CLOSE, SILENCE, ScriptedDevice, tl1_block

IDN = (b"*IDN?\n", b"Polatis,N-OST-16x16-LA1-DMHNS,002414,6.5.2.18\r\n")
STAT_EMPTY = (b":OXC:SWIT:CONN:STAT?\n", b"(@),(@)\r\n")
FAST = Backoff(initial=0.01, maximum=0.05)


def scpi_switch(address: str, timeout: float = 0.5) -> PolatisScpi:
    return PolatisScpi(address, name="ocs", backoff=FAST,
                       settings=LinkSettings(timeout=timeout))


async def test_polatis_scpi_connect_sends_one_checked_message() -> None:
    script = [IDN, STAT_EMPTY,
              (b":OXC:SWIT:CONN:ADD (@1,2),(@17,18);*OPC?;:SYST:ERR?\n",
               b'1;0, "No error"\r\n'),
              (b":OXC:SWIT:CONN:SUB (@2),(@);*OPC?;:SYST:ERR?\n", b'1;0, "No error"\r\n'),
              (b":OXC:SWIT:CONN:STAT?\n", b"(@1),(@17)\r\n")]
    async with ScriptedDevice([script]) as dev, scpi_switch(dev.address) as ocs:
        assert ocs.info is not None and ocs.info.size == "16x16"
        await ocs.connect([(17, 1), (2, 18)])  # either order: ingress goes first on the wire
        await ocs.disconnect([18])  # an egress port: its ingress partner is disconnected
        assert await ocs.cross_connects() == {1: 17}
    assert not dev.mismatches


async def test_polatis_scpi_refuses_bad_requests_before_sending() -> None:
    async with ScriptedDevice([[IDN, STAT_EMPTY]]) as dev, scpi_switch(dev.address) as ocs:
        with pytest.raises(InvalidRequest, match="not on this 16x16"):
            await ocs.connect([(1, 99)])
        with pytest.raises(InvalidRequest, match="ingress port"):
            await ocs.connect([(1, 2)])
        with pytest.raises(InvalidRequest, match="twice"):
            await ocs.connect([(1, 17), (1, 18)])
    assert not dev.mismatches


async def test_polatis_scpi_malformed_map_reply_drops_the_link_and_reconnects() -> None:
    first = [IDN, STAT_EMPTY, (b":OXC:SWIT:CONN:STAT?\n", b"garbage\r\n")]
    second = [IDN, (b":OXC:SWIT:CONN:STAT?\n", b"(@3),(@19)\r\n")]
    async with ScriptedDevice([first, second]) as dev, scpi_switch(dev.address) as ocs:
        events = EventQueue(ocs)
        with pytest.raises(ProtocolError, match="garbage"):
            await ocs.cross_connects()
        resync = await events.next("resync")
        assert resync.drift is not None and resync.drift.unexpected == {3: 19}
        assert ocs.state is LinkState.ONLINE
        assert ocs.expected == {3: 19}
    assert not dev.mismatches


async def test_polatis_scpi_timeout_drops_link_and_commands_fail_fast_while_offline() -> None:
    first = [IDN, STAT_EMPTY, (b":OXC:SWIT:CONN:STAT?\n", SILENCE)]
    async with ScriptedDevice([first]) as dev, scpi_switch(dev.address, 0.2) as ocs:
        events = EventQueue(ocs)
        with pytest.raises(InstrumentTimeout):
            await ocs.cross_connects()
        state = await events.next("state")
        assert state.state is LinkState.BACKOFF
        # No second script: every reconnect attempt fails, commands are refused at once.
        with pytest.raises(InstrumentClosed, match="offline"):
            await ocs.cross_connects()
    assert not dev.mismatches


async def test_polatis_scpi_power_not_supported_on_i_ost() -> None:
    idn = (b"*IDN?\n", b"Polatis,I-OST-24x24-LU1-DMHNS,002414,6.5.2.18\r\n")
    async with ScriptedDevice([[idn, STAT_EMPTY]]) as dev, scpi_switch(dev.address) as ocs:
        with pytest.raises(NotSupported):
            await ocs.port_power([25])


async def test_polatis_scpi_port_states_and_power() -> None:
    script = [IDN, STAT_EMPTY,
              (b":OXC:SWIT:PORT:STAT? (@1,2,3)\n", b"(E,D,F)\r\n"),
              (b":PMON:POW? (@17,18);:SYST:ERR?\n", b'(-12.30,-40.00);0, "No error"\r\n'),
              (b":PMON:POW? (@19);:SYST:ERR?\n", b'(-12.30,-40.00);0, "No error"\r\n')]
    async with ScriptedDevice([script]) as dev, scpi_switch(dev.address) as ocs:
        states = await ocs.port_states([1, 2, 3])
        assert [s.value for s in states.values()] == ["enabled", "disabled", "failed"]
        assert await ocs.port_power([17, 18]) == {17: -12.3, 18: -40.0}
        with pytest.raises(ProtocolError, match="1 powers asked"):
            await ocs.port_power([19])


def tl1_switch(address: str, cls: type = PolatisTl1, timeout: float = 0.5,
               **options: object) -> PolatisTl1:
    return cls(address, name="ocs", backoff=FAST, user="admin", password="root",
               settings=LinkSettings(write_termination="\r\n", timeout=timeout), **options)


POLATIS_TL1_START = [
    (b"ACT-USER::admin:1::root;\r\n", tl1_block(1)),
    (b"RTRV-NETYPE:::2:;\r\n", tl1_block(2, ["Polatis,N-OST-16x16-LA1,OCS,6.5.2"])),
    (b"RTRV-INV::OCS:3:;\r\n", tl1_block(3, ["OCS:SN=002414,PN=x"])),
    (b"RTRV-EQPT::SYSTEM:4:::PARAMETER=SIZE;\r\n", tl1_block(4, ["SYSTEM:SIZE=16x16"])),
    (b"RTRV-PATCH:::5:;\r\n", tl1_block(5, ["1,17"])),
]


async def test_polatis_tl1_login_identify_and_patch() -> None:
    script = [*POLATIS_TL1_START,
              (b"ENT-PATCH::2&3,18&19:6:;\r\n", tl1_block(6)),
              (b"DLT-PATCH::1:7:;\r\n", tl1_block(7)),
              (b"ENT-PATCH::4,20:8:;\r\n", tl1_block(8, deny=("SROF", "Port 20 in use")))]
    async with ScriptedDevice([script]) as dev, tl1_switch(dev.address) as ocs:
        assert ocs.info is not None and ocs.info.serial == "002414"
        assert ocs.expected == {1: 17}
        await ocs.connect([(2, 18), (3, 19)])
        await ocs.disconnect([17])
        with pytest.raises(DeviceError) as refused:
            await ocs.connect([(4, 20)])
        assert refused.value.code == "SROF"
        assert ocs.expected == {2: 18, 3: 19}
    assert not dev.mismatches


async def test_polatis_tl1_logs_in_again_when_the_device_forgot_the_session() -> None:
    script = [*POLATIS_TL1_START,
              (b"RTRV-PATCH:::6:;\r\n", tl1_block(6, deny=("PICC", "Not logged in"))),
              (b"ACT-USER::admin:7::root;\r\n", tl1_block(7)),
              (b"RTRV-PATCH:::8:;\r\n", tl1_block(8, ["1,17"]))]
    async with ScriptedDevice([script]) as dev, tl1_switch(dev.address) as ocs:
        assert await ocs.cross_connects() == {1: 17}
    assert not dev.mismatches


async def test_a_change_refused_for_the_login_and_retried_is_acknowledged_by_the_retry(
        ) -> None:
    script = [*POLATIS_TL1_START,
              (b"ENT-PATCH::2,18:6:;\r\n", tl1_block(6, deny=("PICC", "Not logged in"))),
              (b"ACT-USER::admin:7::root;\r\n", tl1_block(7)),
              (b"ENT-PATCH::2,18:8:;\r\n", tl1_block(8))]
    async with ScriptedDevice([script]) as dev, tl1_switch(dev.address) as ocs:
        made = await ocs.connect([(2, 18)])
        assert made.sent_ns is not None and made.answered_ns is not None
        assert made.sent_ns == made.activated_ns
        assert made.acknowledged_ns == made.answered_ns  # the retry's reply
    assert not dev.mismatches


async def test_tl1_wrong_password_fails_open_with_a_clear_error() -> None:
    script = [(b"ACT-USER::admin:1::root;\r\n", tl1_block(1, deny=("PICC", "Login failed"))),
              (b"", CLOSE)]
    async with ScriptedDevice([script]) as dev:
        ocs = tl1_switch(dev.address)
        with pytest.raises(DeviceError, match="Login failed"):
            await ocs.open()
        assert ocs.state is LinkState.OFFLINE
        await ocs.close()


async def test_calient_two_phase_connect_and_states() -> None:
    script = [
        (b"ACT-USER::admin:1::root;\r\n", tl1_block(1)),
        (b"RTRV-NE:::2:;\r\n",
         tl1_block(2, ["SERIALNUMBER=S1,SWPACKAGE=7.3,STATUS=OK,CHASSISTYPE=S320"])),
        (b"RTRV-CRS:::3:;\r\n", tl1_block(3, [
            "1.1.1-1.1.2:SRCPORT=1.1.1,DSTPORT=1.1.2,GRPNAME=SYSTEM,CONNNAME=1.1.1-1.1.2,"
            "CONNTYPE=2WAY,AS=IS,OS=IS,OC=OK",
            "1.1.3-1.1.4:SRCPORT=1.1.3,DSTPORT=1.1.4,GRPNAME=SYSTEM,CONNNAME=1.1.3-1.1.4,"
            "CONNTYPE=2WAY,AS=UMA,OS=RDY,OC=OK"])),
        (b"ENT-CRS::1.1.5&1.2.1,1.1.6&1.2.2:4::SYSTEM,2WAY;\r\n", tl1_block(4)),
        (b"ACT-CRS::1.1.5&1.2.1,1.1.6&1.2.2:5:;\r\n", tl1_block(5)),
        (b"RTRV-PORT::0:6:;\r\n", tl1_block(6, ["1.1.1:TYPE=OPTICAL,AS=IS,OS=IS,ALIAS=",
                                                  "1.1.2:TYPE=OPTICAL,AS=IS,OS=OOS-AU,ALIAS="])),
        (b"CANC-CRS::1.1.1,1.1.2:7:;\r\n", tl1_block(7)),
        (b"DLT-CRS::1.1.1,1.1.2:8:;\r\n", tl1_block(8)),
    ]
    async with ScriptedDevice([script]) as dev, tl1_switch(
            dev.address, CalientTl1, size="64") as cal:
        assert cal.expected == {1: 2}  # the provisioned-only 1.1.3-1.1.4 is not light
        await cal.connect([(5, 6), (33, 34)])
        states = await cal.port_states([1, 2])
        assert (states[1].value, states[2].value) == ("enabled", "failed")
        await cal.disconnect([2])
        assert cal.expected == {5: 6, 33: 34}
    assert not dev.mismatches


def test_tl1_drivers_need_credentials() -> None:
    with pytest.raises(InvalidRequest, match="needs 'user' and 'password'"):
        PolatisTl1("tcp://127.0.0.1:1", name="x")


async def test_polatis_tl1_malformed_block_and_silence() -> None:
    first = [*POLATIS_TL1_START,
             (b"RTRV-PATCH:::6:;\r\n", b"\r\n\n   SW-A 24-05-01 12:00:00\r\nhello\r\n;"),
             ]
    second = [(b"ACT-USER::admin:7::root;\r\n", tl1_block(7)),
              (b"RTRV-NETYPE:::8:;\r\n", tl1_block(8, ["Polatis,N-OST-16x16-LA1,OCS,6.5.2"])),
              (b"RTRV-INV::OCS:9:;\r\n", tl1_block(9, ["OCS:SN=002414,PN=x"])),
              (b"RTRV-EQPT::SYSTEM:10:::PARAMETER=SIZE;\r\n",
               tl1_block(10, ["SYSTEM:SIZE=16x16"])),
              (b"RTRV-PATCH:::11:;\r\n", tl1_block(11, ["1,17"])),
              (b"RTRV-PATCH:::12:;\r\n", SILENCE)]
    async with ScriptedDevice([first, second]) as dev, tl1_switch(dev.address, timeout=0.2) as ocs:
        events = EventQueue(ocs)
        with pytest.raises(ProtocolError, match="without a response line"):
            await ocs.cross_connects()
        resync = await events.next("resync")
        assert resync.drift is not None and not resync.drift
        with pytest.raises(InstrumentTimeout):
            await ocs.cross_connects()
    assert not dev.mismatches


async def test_calient_malformed_cross_connect_line() -> None:
    script = [
        (b"ACT-USER::admin:1::root;\r\n", tl1_block(1)),
        (b"RTRV-NE:::2:;\r\n", tl1_block(2, ["SERIALNUMBER=S1,CHASSISTYPE=S320"])),
        (b"RTRV-CRS:::3:;\r\n", tl1_block(3, ["1.1.1-1.1.2:GRPNAME=SYSTEM"])),
        (b"", CLOSE),
    ]
    async with ScriptedDevice([script]) as dev:
        cal = tl1_switch(dev.address, CalientTl1, size="64")
        with pytest.raises(ProtocolError, match="lacks SRCPORT/DSTPORT"):
            await cal.open()
        await cal.close()


async def test_query_delay_is_honoured_between_query_and_read() -> None:
    async with ScriptedDevice([[IDN, STAT_EMPTY]]) as dev:
        ocs = PolatisScpi(dev.address, name="ocs",
                          settings=LinkSettings(timeout=0.5, query_delay=0.05))
        await ocs.open()
        await ocs.close()
    # The device answered *IDN? at once; the driver still waited the query delay before
    # reading it, so STAT? could not arrive sooner than that after *IDN?.
    idn_at, stat_at = dev.arrivals
    assert stat_at - idn_at >= 0.05


async def test_requests_of_the_wrong_shape_are_refused_clearly() -> None:
    async with ScriptedDevice([[IDN, STAT_EMPTY]]) as dev, scpi_switch(dev.address) as ocs:
        with pytest.raises(InvalidRequest, match="port '17' is not on"):
            await ocs.connect([(1, "17")])  # type: ignore[list-item]
        with pytest.raises(InvalidRequest, match="not a port pair"):
            await ocs.connect([(1, 17, 18)])  # type: ignore[list-item]
        with pytest.raises(InvalidRequest, match="port 0 is not on"):
            await ocs.disconnect([0])
        assert ocs.expected == {}
    assert not dev.mismatches
