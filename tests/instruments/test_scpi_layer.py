import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instruments import scpi
from instruments.errors import DeviceError, ProtocolError
from instruments.link import Link
from tests.scripted import ScriptedDevice


def test_channel_lists() -> None:
    assert scpi.channel_list([1, 2, 3]) == "(@1,2,3)"
    assert scpi.channel_list([]) == "(@)"
    assert scpi.parse_channel_lists("(@1,2),(@17,18)") == [[1, 2], [17, 18]]
    assert scpi.parse_channel_lists("(@),(@)") == [[], []]
    assert scpi.parse_channel_lists("(@1), (@17)") == [[1], [17]]
    assert scpi.parse_channel_lists("(@1:4)") == [[1, 2, 3, 4]]
    with pytest.raises(ProtocolError):
        scpi.parse_channel_lists("1,2")
    with pytest.raises(ProtocolError):
        scpi.parse_channel_lists("(@1,x)")


def test_error_queue_entries_in_both_forms() -> None:
    assert scpi.parse_error('0, "No error"') == (0, "No error")
    assert scpi.parse_error('+0,"No error"') == (0, "No error")
    assert scpi.parse_error('-113, "Undefined header"') == (-113, "Undefined header")
    with pytest.raises(ProtocolError):
        scpi.parse_error("whatever")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=24), st.from_regex(r'\A[+-]?0\s*,.{0,12}\Z'),
                 st.sampled_from(['0,"No error"', '+0, "No error"', "-0,", "0", "00,x",
                                  ' 0,"ok" ', '1,"x"'])))
def test_an_entry_told_no_error_at_once_is_code_0_by_the_full_parse(entry: str) -> None:
    """command_checked tells a plain code-0 entry without the regular expression; whatever
    it lets through so, the full parse reads as code 0 too."""
    if scpi._no_error(entry):
        assert scpi.parse_error(entry)[0] == 0


def test_split_answers_respects_quotes() -> None:
    assert scpi.split_answers('1;0, "No error"') == ["1", '0, "No error"']
    assert scpi.split_answers('"a;b";2') == ['"a;b"', "2"]


@pytest.mark.parametrize("replies", [b'1;0, "No error"\r\n', b'1\r\n0, "No error"\r\n'])
async def test_command_checked_accepts_joined_and_separate_answers(replies: bytes) -> None:
    script = [(b":OXC:SWIT:DISC:ALL;*OPC?;:SYST:ERR?\n", replies)]
    async with ScriptedDevice([script]) as dev:
        link = Link(dev.address)
        await link.open()
        await scpi.command_checked(link, ":OXC:SWIT:DISC:ALL")
        await link.close()
    assert not dev.mismatches


async def test_command_checked_raises_the_devices_error_and_drains_the_queue() -> None:
    script = [
        (b":OXC:SWIT:CONN:ADD (@99),(@17);*OPC?;:SYST:ERR?\n",
         b'1;-222, "Data out of range"\r\n'),
        (b":SYST:ERR?\n", b'0, "No error"\r\n'),
    ]
    async with ScriptedDevice([script]) as dev:
        link = Link(dev.address)
        await link.open()
        with pytest.raises(DeviceError) as info:
            await scpi.command_checked(link, ":OXC:SWIT:CONN:ADD (@99),(@17)")
        await link.close()
    assert info.value.code == -222
    assert "Data out of range" in str(info.value)
    assert not dev.mismatches


def test_program_message_uses_relative_headers() -> None:
    assert (scpi.program_message(":SENS1:POW:WAV 1550NM", ":SENS1:POW:UNIT 0", "*OPC?",
                                 ":SENS1:POW:ATIM 0.001")
            == ":SENS1:POW:WAV 1550NM;UNIT 0;*OPC?;ATIM 0.001")
    assert (scpi.program_message(":OXC:SWIT:CONN:ONLY (@1),(@17)", ":OXC:SWIT:CONN:STAT?",
                                 ":SYST:ERR?")
            == ":OXC:SWIT:CONN:ONLY (@1),(@17);STAT?;:SYST:ERR?")
    assert scpi.program_message("*CLS", ":SYST:ERR?") == "*CLS;:SYST:ERR?"


async def test_relative_program_message_against_the_emulator() -> None:
    from emulators import EmulatedLab, EmulatorSpec

    async with EmulatedLab([EmulatorSpec("x", "polatis", {}, {"technology": "ideal"})],
                           control=False) as lab:
        link = Link(lab.endpoints["x"]["scpi"])
        await link.open()
        message = scpi.program_message(":OXC:SWIT:CONN:ONLY (@1,2),(@17,18)",
                                       ":OXC:SWIT:CONN:STAT?", ":OXC:SWIT:SIZE?", "*OPC?")
        assert message == ":OXC:SWIT:CONN:ONLY (@1,2),(@17,18);STAT?;:OXC:SWIT:SIZE?;*OPC?"
        assert await scpi.query_all(link, message, 3) == ["(@1,2),(@17,18)", "16,16", "1"]
        await link.close()
