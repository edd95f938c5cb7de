"""``labd discover``: the addresses ``labd emulate demo`` prints, asked over real sockets
and a pty, recognised every one, and the fragment it prints accepted by ``labd check``;
its target parsing under hypothesis; the identities it knows."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labd import deadlines
from labd.client.control import spawn_emulators
from labd.commands.discover import (
    BOARD,
    MAX_PORTS,
    SCPI,
    TL1,
    Target,
    from_visa,
    parse_targets,
    recognise,
    report,
    summary,
)
from labd.lab.loader import load_lab


async def labd(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(deadlines.current().times(60)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_discover_recognises_every_instrument_labd_emulate_demo_prints(
        tmp_path: Path) -> None:
    emulators = await spawn_emulators("demo")
    try:
        expected = {e.driver: 0 for e in load_lab("demo").instrument}
        drivers = {e.id: e.driver for e in load_lab("demo").instrument}
        endpoints = dict(emulators.endpoints)
        assert set(endpoints) == set(drivers)
        code, out, err = await labd("discover", "--no-visa", "--no-serial", "--json",
                                    *endpoints.values())
        assert code == 0, err
        found = {item["address"].split("?")[0]: item
                 for item in map(json.loads, out.splitlines())}
        for ident, address in endpoints.items():
            item = found[address.split("?")[0]]
            assert item["driver"] == drivers[ident], (ident, item)
            expected[drivers[ident]] += 1
        assert all(expected.values())
        code, fragment, err = await labd("discover", "--no-visa", "--no-serial",
                                         *endpoints.values())
    finally:
        await emulators.stop()
    assert code == 0, err
    assert fragment.count("[[instrument]]") == len(endpoints)
    assert "size = \"16x16\"" in fragment and "channels = 8" in fragment
    path = tmp_path / "bench.toml"
    path.write_text('[lab]\nname = "bench"\n\n' + fragment)
    code, out, err = await labd("check", str(path))
    assert code == 0, out + err
    lab = load_lab(path)
    assert sorted(e.driver for e in lab.instrument) == sorted(drivers.values())


async def test_a_port_nobody_listens_on_is_reported_not_recognised(tmp_path: Path) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    code, out, err = await labd("discover", "--no-visa", "--no-serial", "--timeout", "0.2",
                                f"127.0.0.1:{port}")
    assert code == 0, err
    assert "# recognised (0 of 1 asked):" in out and "[[instrument]]" not in out
    assert f"tcp://127.0.0.1:{port}" in out


async def test_the_listing_runs_where_there_is_nothing_attached() -> None:
    code, out, err = await labd("discover", "--list-only")
    assert code == 0, err
    assert out.startswith("# labd discover") and "# recognised (0 of 0 asked):" in out


async def test_a_bad_address_is_one_line_and_exit_2() -> None:
    code, _, err = await labd("discover", "--no-visa", "--no-serial", "10.0.0.5:99999")
    assert code == 2 and "ports are 1..65535" in err and "Traceback" not in err


@pytest.mark.parametrize(("query", "reply", "driver"), [
    (SCPI, "Polatis,N-OST-48x48-LA1-DMHNS,002414,6.5.2.18", "polatis-scpi"),
    (SCPI, "Keysight Technologies,N7744A,MY1,1.2", "keysight-n77xx"),
    (SCPI, "Agilent Technologies,N7745A,MY1,1.2", "keysight-n77xx"),
    (SCPI, "Thorlabs,PM100USB,P2000,1.6.0", "thorlabs-pm100"),
    (SCPI, "Rohde&Schwarz,RTO2044,1,2", None),
    (TL1, '\r\n\n   SW 26-01-01 00:00:00\r\nM  1 COMPLD\r\n   "Polatis,N-OST,OCS,6.5"\r\n;',
     "polatis-tl1"),
    (TL1, "\r\n\n   CALIENT 26-01-01 00:00:00\r\nM  1 DENY\r\n   IICM\r\n;", "calient-tl1"),
    (TL1, "\r\n\n   S320 26-01-01 00:00:00\r\nM  1 DENY\r\n   IICM\r\n;", "calient-tl1"),
    (TL1, "\r\n\n   ( nil ) 26-01-01\r\nM  1 DENY\r\n   PICC\r\n   /* Not logged in */\r\n;",
     "polatis-tl1"),
    (BOARD, "Q8iv-01A0", "qontrol-mesh"),
    (BOARD, "Q8b-****", "qontrol-mesh"),
    (BOARD, "E10:00", None),
])
def test_identities(query: str, reply: str, driver: str | None) -> None:
    assert recognise(query, reply)[0] == driver


def test_sizes_channels_and_summaries() -> None:
    assert recognise(SCPI, "Polatis,N-OST-48x48-LA1,1,2")[1] == {"size": "48x48"}
    assert recognise(SCPI, "Keysight Technologies,N7745C,1,2")[1] == {"channels": 8}
    block = "\r\n\n   ( nil ) 26-01-01\r\nM  1 DENY\r\n   PICC\r\n   /* Not logged in */\r\n;"
    assert summary(TL1, block) == "M  1 DENY PICC /* Not logged in */"
    assert from_visa("ASRL/dev/ttyUSB0::INSTR") == Target("serial:///dev/ttyUSB0", "serial",
                                                          "VISA ASRL/dev/ttyUSB0::INSTR")
    assert from_visa("USB0::0x1313::0x8078::P0012345::INSTR") == Target(
        "visa://USB0::0x1313::0x8078::P0012345::INSTR", "visa", "USB 1313:8078, Thorlabs PM100D")
    # pyvisa-py's ??? serial: this user may not open the device, and the listing says so.
    unreadable = report([], [], ["USB0::4883::32882::???::INSTR"], "")
    assert "USB 1313:8072, Thorlabs PM100USB: its serial number could not be read" in unreadable
    assert "udev rule" in unreadable
    assert from_visa("PRLGX-ASRL::/dev/ttyS0::INTFC") is None


def test_targets() -> None:
    assert parse_targets(["10.0.0.5:5025-5027"]) == [
        Target(f"tcp://10.0.0.5:{p}", "tcp") for p in (5025, 5026, 5027)]
    assert parse_targets(["tcp://rack-a.lab:3082"]) == [Target("tcp://rack-a.lab:3082", "tcp")]
    assert parse_targets(["/dev/pts/3"], 9600) == [
        Target("serial:///dev/pts/3?baud=9600", "serial")]
    assert parse_targets(["serial:///dev/ttyUSB0?baud=57600"]) == [
        Target("serial:///dev/ttyUSB0?baud=57600", "serial")]
    assert parse_targets(["USB0::0x1313::0x8072::P1::INSTR"]) == [
        Target("visa://USB0::0x1313::0x8072::P1::INSTR", "visa")]
    with pytest.raises(ValueError, match=f"at most {MAX_PORTS} a range"):
        parse_targets(["h:1-65535"])
    with pytest.raises(ValueError, match="the lower first"):
        parse_targets(["h:10-5"])


@given(st.text(max_size=80))
def test_any_text_is_a_target_or_one_clear_error(text: str) -> None:
    try:
        targets = parse_targets([text])
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert all(t.kind in ("tcp", "serial", "visa") for t in targets)
        assert len(targets) <= MAX_PORTS


@given(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True), st.integers(1, 65535),
       st.integers(0, 50))
def test_a_range_names_each_port_once(host: str, low: int, extra: int) -> None:
    high = min(65535, low + extra)
    targets = parse_targets([f"{host}:{low}-{high}"])
    assert [t.address for t in targets] == [f"tcp://{host}:{p}" for p in range(low, high + 1)]
