"""``labd discover``: what is attached, asked who it is, written as a lab-file fragment.

It lists VISA resources (pyvisa, the pyvisa-py backend unless ``LABD_VISA_LIBRARY`` names
another) and serial ports (pyserial's ``list_ports``, with VID:PID and serial number), takes
serial paths, VISA resources and TCP hosts with ports or port ranges from the command line,
and asks each only an identity query, with a short timeout: ``*IDN?`` (SCPI), then
``RTRV-NETYPE`` (TL1) on a fresh connection, then ``id?`` (a Qontrol board). Nothing else
is ever written, so it is safe on a bench in use. What it recognises becomes
``[[instrument]]`` tables; the rest of the output is TOML comments, so the whole of it can
be saved as a lab file's start (docs/discover.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import typer

from labd.commands.common import fail

#: At most this many targets are asked at once (each holds a socket or a port).
CONCURRENCY = 64
#: The most TCP ports one target may name (a range).
MAX_PORTS = 4096
#: The most targets one run asks.
MAX_TARGETS = 16_384

SCPI = "*IDN?"
TL1 = "RTRV-NETYPE:::1;"
BOARD = "id?"

_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}$|^\[[0-9A-Fa-f:.]{2,45}\]$", re.ASCII)
_PORTS = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$", re.ASCII)
_NXM = re.compile(r"(\d{1,4})[xX](\d{1,4})", re.ASCII)
_BOARD_ID = re.compile(r"^Q[0-9A-Za-z]{1,8}-[0-9A-Fa-f*]{4}$", re.ASCII)
_BOARD_ERROR = re.compile(r"^E\d{1,3}:\d{1,4}$", re.ASCII)


@dataclass(frozen=True)
class Target:
    """One address to ask: ``tcp://``, ``serial://`` or ``visa://``; ``note`` says where it
    was found (a serial port's VID:PID and serial number)."""

    address: str
    kind: str
    note: str = ""


@dataclass
class Found:
    """What one target answered and what labd makes of it."""

    address: str
    query: str = ""
    reply: str = ""
    driver: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    """Lab-file fields beyond id, driver and address (a size read from the model)."""
    guess: str = ""
    """Why the driver is only likely, where it is (a TL1 switch that asks for a login)."""
    note: str = ""
    error: str = ""


def parse_targets(texts: list[str], baud: int = 115200) -> list[Target]:
    """Targets from the command line: ``tcp://HOST:PORT``, ``HOST:PORT``, ``HOST:LOW-HIGH``
    (a range, at most MAX_PORTS ports), ``serial:///dev/X[?baud=N]`` or a path beginning
    ``/dev/`` (at ``baud``), ``visa://RESOURCE`` or a VISA resource (``...::INSTR``).
    ValueError names the first that is none of these."""
    from instruments.address import parse_address
    from instruments.errors import AddressError

    targets: list[Target] = []
    for text in texts:
        if text.startswith("/"):
            text = f"serial://{text}?baud={baud}"
        elif "::" in text and "://" not in text:
            text = f"visa://{text}"
        if text.startswith(("serial://", "visa://")):
            try:
                address = parse_address(text)
            except AddressError as exc:
                raise ValueError(str(exc)) from None
            if address.scheme == "serial" and "baud" not in address.options:
                text += ("&" if "?" in text else "?") + f"baud={baud}"
            targets.append(Target(text, address.scheme))
            continue
        host, ports = _host_and_ports(text)
        targets.extend(Target(f"tcp://{host}:{port}", "tcp") for port in ports)
        if len(targets) > MAX_TARGETS:
            raise ValueError(f"more than {MAX_TARGETS} addresses to ask; name fewer ports")
    return targets


def _host_and_ports(text: str) -> tuple[str, range]:
    expected = ("expected tcp://HOST:PORT, HOST:PORT, HOST:LOW-HIGH, serial:///dev/PATH, "
                "a /dev/ path or a VISA resource")
    rest = text.removeprefix("tcp://")
    host, colon, ports = rest.rpartition(":")
    match = _PORTS.match(ports)
    if not colon or not host or not _HOST.match(host) or match is None:
        raise ValueError(f"{_short(text)}: {expected}")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{_short(text)}: ports are 1..65535, the lower first")
    if high - low + 1 > MAX_PORTS:
        raise ValueError(f"{_short(text)}: {high - low + 1} ports; at most {MAX_PORTS} a "
                         "range")
    return host, range(low, high + 1)


def summary(query: str, reply: str, limit: int = 80) -> str:
    """A reply on one line: a TL1 block's lines after its header (``M  1 DENY PICC /* Not
    logged in */``), another reply's first line."""
    lines = [line.strip() for line in reply.splitlines() if line.strip() not in ("", ";")]
    if query == TL1:
        return " ".join(lines[1:])[:limit]  # the first is the header: SID, date, time
    return (lines or [""])[0][:limit]


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def recognise(query: str, reply: str) -> tuple[str | None, dict[str, Any], str]:
    """(driver, extra lab-file fields, guess) for one identity reply; driver None when it
    is no instrument labd drives. ``guess`` is empty where the reply names the device."""
    text = reply.strip()
    lower = text.lower()
    if query == SCPI:
        parts = [p.strip() for p in text.split(",")]
        vendor, model = parts[0].lower(), (parts[1] if len(parts) > 1 else "")
        if "polatis" in vendor or "huber" in vendor:
            size = _NXM.search(model)
            return "polatis-scpi", ({"size": f"{size[1]}x{size[2]}"} if size else {}), ""
        if vendor.startswith(("keysight", "agilent")) and re.search(r"N77(44|45)", model):
            return "keysight-n77xx", {"channels": 8 if "7745" in model else 4}, ""
        if vendor.startswith("thorlabs") and re.match(r"PM10\d", model):
            return "thorlabs-pm100", {}, ""
        return None, {}, ""
    if query == TL1:
        if "COMPLD" in text and "polatis" in lower:
            return "polatis-tl1", {}, ""
        if "calient" in lower:
            return "calient-tl1", {}, ""
        if "DENY" in text and "IICM" in text:
            return "calient-tl1", {}, ("a TL1 switch without RTRV-NETYPE, as a CALIENT "
                                       "S-Series is")
        if "DENY" in text:
            return "polatis-tl1", {}, ("a TL1 switch that wants a login before "
                                       "RTRV-NETYPE, as a Polatis does")
        return None, {}, ""
    if query == BOARD and _BOARD_ID.match(text):
        return "qontrol-mesh", {"size": "8x8"}, ("a Qontrol-style board: the mesh's size is "
                                                 "not asked, set it")
    return None, {}, ""


async def ask(target: Target, timeout: float) -> Found:
    """The target's identity, by the fewest queries: each on a fresh connection over TCP
    (a TL1 device would take the bytes of a SCPI query into its next command)."""
    from instruments.errors import InstrumentError, InstrumentTimeout

    found = Found(target.address, note=target.note)
    queries = [SCPI] if target.kind == "visa" else \
        [SCPI, BOARD] if target.kind == "serial" else [SCPI, TL1, BOARD]
    for query in queries:
        try:
            reply = await _query(target.address, query, timeout)
        except InstrumentTimeout:
            continue
        except InstrumentError as exc:
            found.error = str(exc)
            return found
        if target.kind == "serial" and query == SCPI and _BOARD_ERROR.match(reply.strip()):
            continue  # a Qontrol board refuses *IDN? with an error line: ask it its way
        found.query, found.reply = query, reply.strip()[:200]
        found.driver, found.fields, found.guess = recognise(query, reply)
        if found.driver is not None:
            return found
    if not found.query:
        found.error = f"no answer to {', '.join(queries)} within {timeout:g} s"
    return found


async def _query(address: str, query: str, timeout: float) -> str:
    from instruments.link import Link, LinkSettings

    tl1 = query == TL1
    link = Link(address, LinkSettings(write_termination="" if tl1 else "\n",
                                      read_termination="\n", timeout=timeout), name=address)
    await link.open()
    try:
        link.discard_input()
        await link.write(query)
        if tl1:
            return (await link.read_until(b"\n;")).decode("latin-1")
        return await link.read_line()
    finally:
        await link.close()


async def ask_all(targets: list[Target], timeout: float) -> list[Found]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(target: Target) -> Found:
        async with limit:
            return await ask(target, timeout)

    return list(await asyncio.gather(*(one(t) for t in targets)))


def serial_ports() -> list[Target]:
    """Serial ports pyserial lists, each with its USB VID:PID and serial number."""
    from serial.tools import list_ports

    out = []
    for port in sorted(list_ports.comports(), key=lambda p: p.device):
        usb = f"{port.vid:04x}:{port.pid:04x}" if port.vid is not None and \
            port.pid is not None else "no USB ids"
        serial = f"serial {port.serial_number}" if port.serial_number else "no serial number"
        description = port.description if port.description not in (None, "n/a") else ""
        note = ", ".join(x for x in (usb, serial, description) if x)
        out.append(Target(f"serial://{port.device}", "serial", note))
    return out


def visa_resources() -> list[str]:
    """Every resource the VISA library lists (ASRL ones included); none if pyvisa cannot
    list (no backend), which the output says."""
    import pyvisa

    library = os.environ.get("LABD_VISA_LIBRARY", "@py")
    with warnings.catch_warnings():
        # pyvisa-py warns for each optional discovery package it lacks (zeroconf, ...).
        warnings.simplefilter("ignore")
        manager = pyvisa.ResourceManager(library)
        try:
            return sorted(manager.list_resources("?*"))
        finally:
            with contextlib.suppress(Exception):
                manager.close()


def from_visa(resource: str) -> Target | None:
    """A listed resource as a target: INSTR resources through VISA, ``ASRL<path>`` as the
    serial port it is; interfaces (``INTFC``) are not asked."""
    if not resource.endswith("::INSTR"):
        return None
    asrl = re.match(r"^ASRL(/dev/[^:]+)::INSTR$", resource)
    if asrl:
        return Target(f"serial://{asrl.group(1)}", "serial", f"VISA {resource}")
    return Target(f"visa://{resource}", "visa", usb_note(resource))


#: USB test-and-measurement devices known by their IDs (docs/protocols.md §11.2).
USB_IDS = {(0x1313, 0x8072): "Thorlabs PM100USB", (0x1313, 0x8078): "Thorlabs PM100D"}


def usb_note(resource: str) -> str:
    """What a USB resource's IDs say before it is asked, and why it may not answer: a
    serial number pyvisa-py could not read (``???``) means this user may not open the
    device."""
    usb = re.match(r"^USB\d*::(0x[0-9A-Fa-f]+|\d+)::(0x[0-9A-Fa-f]+|\d+)::([^:]*)", resource)
    if usb is None:
        return ""
    ids = (int(usb.group(1), 0), int(usb.group(2), 0))
    note = f"USB {ids[0]:04x}:{ids[1]:04x}" + (f", {USB_IDS[ids]}" if ids in USB_IDS else "")
    if usb.group(3) == "???":
        note += (": its serial number could not be read, so this user may not open the "
                 "device: give it access (a udev rule for the USB IDs), or use the kernel's "
                 "usbtmc driver (usbtmc:///dev/usbtmc0)")
    return note


PREFIX = {"polatis-scpi": "ocs", "polatis-tl1": "ocs", "calient-tl1": "ocs",
          "qontrol-mesh": "mesh", "keysight-n77xx": "pm", "thorlabs-pm100": "pm"}


def fragment(found: list[Found]) -> str:
    """``[[instrument]]`` tables for what was recognised, ids numbered per kind."""
    counts: dict[str, int] = {}
    tables = []
    for item in found:
        if item.driver is None:
            continue
        prefix = PREFIX[item.driver]
        counts[prefix] = counts.get(prefix, 0) + 1
        ident = f"{prefix}{counts[prefix]}"
        lines = ["[[instrument]]", f"id = {json.dumps(ident)}",
                 f"driver = {json.dumps(item.driver)}", f"address = {json.dumps(item.address)}"]
        lines.append(f"description = {json.dumps(summary(item.query, item.reply, 120))}")
        for key, value in item.fields.items():
            lines.append(f"{key} = {json.dumps(value)}")
        if item.driver.endswith("-tl1"):
            lines += ['user = "admin"  # the switch\'s TL1 user',
                      f"password_env = {json.dumps(ident.upper() + '_PASSWORD')}"]
        if item.guess:
            lines.insert(1, f"# likely: {item.guess}")
        tables.append("\n".join(lines))
    return "\n\n".join(tables) + ("\n" if tables else "")


def report(found: list[Found], listed_serial: list[Target], listed_visa: list[str] | None,
           visa_error: str) -> str:
    """The whole output: what was listed and answered as comments, then the fragment."""
    lines = ["# labd discover: identity queries only (*IDN?, RTRV-NETYPE, id?)"]
    if listed_visa is not None:
        lines.append(f"# VISA resources ({len(listed_visa)}):")
        lines += [f"#   {r}" + (f"  {note}" if (note := usb_note(r)) else "")
                  for r in listed_visa] or ["#   none"]
    elif visa_error:
        lines.append(f"# VISA resources: not listed ({visa_error})")
    if listed_serial:
        lines.append(f"# serial ports ({len(listed_serial)}):")
        lines += [f"#   {t.address.removeprefix('serial://')}  {t.note}" for t in listed_serial]
    recognised = [f for f in found if f.driver is not None]
    lines.append(f"# recognised ({len(recognised)} of {len(found)} asked):")
    lines += [f"#   {f.address}  {f.driver}  {summary(f.query, f.reply)}"
              for f in recognised] or ["#   none"]
    answered = [f for f in found if f.driver is None and f.reply]
    if answered:
        lines.append("# answered, not recognised:")
        lines += [f"#   {f.address}  {f.query} → {summary(f.query, f.reply)!r}"
                  for f in answered]
    silent = [f for f in found if f.driver is None and not f.reply]
    if silent:
        lines.append(f"# no answer or not reachable ({len(silent)}):")
        lines += [f"#   {f.address}  {f.error[:100]}" for f in silent[:50]]
        if len(silent) > 50:
            lines.append(f"#   and {len(silent) - 50} more")
    return "\n".join(lines) + "\n\n" + fragment(found)


def discover(
    targets: Annotated[list[str] | None, typer.Argument(
        help="Addresses to ask besides those listed: HOST:PORT, HOST:LOW-HIGH (a port "
             "range), tcp://HOST:PORT, /dev/ttyUSB0 or serial:///dev/pts/3?baud=N, a VISA "
             "resource.", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(min=0.01, max=30,
                                           help="Seconds to wait for each answer.")] = 0.5,
    baud: Annotated[int, typer.Option(min=50, max=4_000_000,
                                      help="Baud rate of serial ports given without one "
                                           "and of those listed.")] = 115200,
    visa: Annotated[bool, typer.Option(help="List (and ask) the VISA library's "
                                            "resources.")] = True,
    serial: Annotated[bool, typer.Option(help="List (and ask) the serial ports.")] = True,
    ask_listed: Annotated[bool, typer.Option(
        "--ask-listed/--list-only", help="Ask the listed VISA resources and serial ports "
                                         "too, or only list them.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a target "
                                                         "instead.")] = False,
) -> None:
    """Find the instruments attached: list VISA resources and serial ports (VID:PID, serial
    number), ask each, and each address given, its identity (*IDN?, RTRV-NETYPE, id?; short
    timeouts; nothing else is written), and print a lab-file fragment (an instrument table
    for each one recognised)."""
    from labd.runtime import run

    try:
        given = parse_targets(list(targets or []), baud)
    except ValueError as exc:
        raise fail(str(exc)) from None
    listed_serial = serial_ports() if serial else []
    listed_visa: list[str] | None = None
    visa_error = ""
    if visa:
        try:
            listed_visa = visa_resources()
        except Exception as exc:  # a missing or broken VISA library: said, not fatal
            visa_error = f"{type(exc).__name__}: {exc}"[:200]
    asked = list(given)
    if ask_listed:
        seen = {t.address.split("?")[0] for t in asked}
        for target in [*listed_serial, *filter(None, map(from_visa, listed_visa or []))]:
            if target.kind == "serial":
                target = Target(f"{target.address}?baud={baud}", "serial", target.note)
            if target.address.split("?")[0] not in seen:
                seen.add(target.address.split("?")[0])
                asked.append(target)
    found = run(ask_all(asked, timeout))
    if as_json:
        for item in found:
            print(json.dumps(asdict(item)), flush=True)
        return
    print(report(found, listed_serial, listed_visa, visa_error), end="")
