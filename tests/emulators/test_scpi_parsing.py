"""The emulators' SCPI parsing: the quick paths every driver command takes give what the
general readers give, on whatever hypothesis writes, and a header resolved once resolves
the same from the session's memory."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from emulators.wire.scpi import (
    ScpiDeviceSession,
    ScpiError,
    parse_lists,
    parse_lists_by_list,
    split_units,
    split_units_by_character,
)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.text(alphabet='ab :*?;()"@1,\t', max_size=40),
                 st.lists(st.sampled_from([":OXC:SWIT:CONN:ONLY (@3),(@22)", "*OPC?",
                                           ":SYST:ERR?", "ERR?", ' "a;b"', "(@1;2)", ")",
                                           "("]), max_size=5).map(";".join)))
def test_a_plain_message_splits_as_character_by_character(message: str) -> None:
    assert split_units(message) == split_units_by_character(message)


def _outcome(read: object, text: str, limit: int) -> object:
    try:
        return read(text, limit)  # type: ignore[operator]
    except ScpiError as exc:
        return exc.code, exc.text


_PORT = st.integers(min_value=0, max_value=1_000_000_000)
_TIGHT = st.lists(st.lists(_PORT, max_size=40), min_size=1, max_size=3).map(
    lambda lists: ",".join("(@" + ",".join(map(str, ports)) + ")" for ports in lists))


@settings(max_examples=2000, deadline=None)
@given(st.one_of(_TIGHT, st.text(alphabet="(@),:0123456789 ", min_size=1, max_size=30)),
       st.integers(min_value=1, max_value=40))
def test_tight_channel_lists_read_as_list_by_list(text: str, limit: int) -> None:
    if not text.strip():
        return
    assert _outcome(parse_lists, text, limit) == _outcome(parse_lists_by_list, text.strip(),
                                                          limit)


def _session() -> ScpiDeviceSession:
    """A small instrument: a source with numeric suffixes, a setting, the error queue."""
    volts = ["1"]
    session = ScpiDeviceSession({
        "*OPC?": lambda a, s: "1",
        ":SOURce:VOLTage?": lambda a, s: f"{volts[0]}@{s}",
        ":SOURce:VOLTage": lambda a, s: volts.__setitem__(0, a),
        ":SOURce:CURRent?": lambda a, s: f"2@{s}",
        ":SYSTem:ERRor?": lambda a, s: session.state.pop_error(),
    })
    return session


_UNITS = st.sampled_from([":SOUR:VOLT?", "SOUR2:VOLT?", "VOLT?", "CURR?", "VOLT 3",
                          ":SOUR1:CURR?", "*OPC?", "SYST:ERR?", ":SYST:ERR?", "ERR?",
                          "NOPE?", ":SOURCE:VOLTAGE?", "sour:volt?"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_UNITS, min_size=1, max_size=5).map(";".join), min_size=1,
                max_size=6))
def test_headers_resolve_alike_from_memory(messages: list[str]) -> None:
    async def answers(fresh: bool) -> list[bytes | None]:
        session = _session()
        out = []
        for message in messages:
            if fresh:
                session.state.engine._resolved.clear()
            out.append(await session.handle(message.encode(), 0))
        return out

    assert asyncio.run(answers(False)) == asyncio.run(answers(True))
