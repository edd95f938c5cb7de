import pytest

from instruments.errors import AuthenticationError, DeviceError, ProtocolError
from instruments.link import Link, LinkSettings
from instruments.tl1 import Tl1Message, Tl1Session, format_command, parse_aid_list, parse_block
from tests.scripted import ScriptedDevice, tl1_block


def test_format_command() -> None:
    assert format_command("RTRV-PATCH", ctag=3) == "RTRV-PATCH:::3:;"
    assert format_command("ENT-PATCH", aid="1&2,17&18", ctag=4) == "ENT-PATCH::1&2,17&18:4:;"
    assert (format_command("RTRV-EQPT", aid="SYSTEM", ctag=5, params="PARAMETER=SIZE")
            == "RTRV-EQPT::SYSTEM:5::PARAMETER=SIZE;")


def test_parse_compld_with_data_lines() -> None:
    (msg,) = parse_block(tl1_block(3, ["1,17", "2,18"]).decode())
    assert (msg.kind, msg.tag, msg.status, msg.sid) == ("response", "3", "COMPLD", "SW-A")
    assert msg.lines == ["1,17", "2,18"]


def test_parse_deny_code_and_comment() -> None:
    (msg,) = parse_block(tl1_block(5, deny=("IICM", "Invalid command")).decode())
    assert (msg.status, msg.code, msg.comment) == ("DENY", "IICM", "Invalid command")


def test_parse_autonomous_prompt_and_acknowledgement() -> None:
    text = ('agent> \r\nIP 7\r\n<\r\n\r\n\n   "SW A" 24-05-01 12:00:00\r\n'
            '*C 12 REPT ALM PORT\r\n   "3:CR,PORTFAIL,SA"\r\n;')
    (msg,) = parse_block(text)
    assert (msg.kind, msg.alarm, msg.tag, msg.status) == ("autonomous", "*C", "12",
                                                          "REPT ALM PORT")
    assert msg.sid == "SW A"
    assert msg.lines == ["3:CR,PORTFAIL,SA"]


def test_parse_block_rejects_noise() -> None:
    with pytest.raises(ProtocolError):
        parse_block("\r\n   hello there\r\n;")


def test_aid_lists() -> None:
    assert parse_aid_list("1&3&7") == [1, 3, 7]
    assert parse_aid_list("1&&4") == [1, 2, 3, 4]
    assert parse_aid_list("1&&3&9") == [1, 2, 3, 9]
    with pytest.raises(ProtocolError):
        parse_aid_list("a&b")


async def test_session_skips_late_replies_and_surfaces_autonomous_messages() -> None:
    auto = b"\r\n\n   SW-A 24-05-01 12:00:00\r\nA  9 REPT EVT PATCH\r\n   \"1,17:CONNECTED\"\r\n;"
    script = [(b"RTRV-PATCH:::2:;\r\n", tl1_block(1, ["stale"]) + auto + tl1_block(2, ["1,17"]))]
    seen: list[Tl1Message] = []
    async with ScriptedDevice([script]) as dev:
        link = Link(dev.address, LinkSettings(write_termination="\r\n"))
        await link.open()
        session = Tl1Session(on_autonomous=seen.append, ctag_start=2)
        reply = await session.command(link, "RTRV-PATCH")
        await link.close()
    assert reply.lines == ["1,17"]
    assert [m.status for m in seen] == ["REPT EVT PATCH"]
    assert not dev.mismatches


async def test_session_deny_and_not_logged_in() -> None:
    script = [
        (b"FOO-BAR:::1:;\r\n", tl1_block(1, deny=("IICM", "Invalid command"))),
        (b"RTRV-PATCH:::2:;\r\n", tl1_block(2, deny=("PICC", "Not logged in"))),
        (b"ACT-USER::admin:3::bad;\r\n", tl1_block(3, deny=("PICC", "Login failed"))),
    ]
    async with ScriptedDevice([script]) as dev:
        link = Link(dev.address, LinkSettings(write_termination="\r\n"))
        await link.open()
        session = Tl1Session()
        with pytest.raises(DeviceError) as refused:
            await session.command(link, "FOO-BAR")
        assert refused.value.code == "IICM"
        assert not isinstance(refused.value, AuthenticationError)
        with pytest.raises(AuthenticationError):
            await session.command(link, "RTRV-PATCH")
        with pytest.raises(AuthenticationError, match="Login failed"):
            await session.login(link, "admin", "bad")
        await link.close()
    assert not dev.mismatches
