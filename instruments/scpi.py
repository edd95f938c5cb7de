"""SCPI (IEEE 488.2) message helpers: channel lists, compound messages, the error queue.

Devices differ in how they answer a compound query line (``Q1?;Q2?``): IEEE 488.2 joins the
answers with ``;`` on one line, some firmware sends one line per answer. :func:`query_all`
accepts both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from instruments.errors import DeviceError, DeviceRestarted, ProtocolError
from instruments.link import Link
from instruments.numbers import reply_float, reply_int, shown
from instruments.transports.base import BUFFER_LIMIT

#: Most ports a channel list in a reply may name when the device's size is not known yet.
MAX_LIST_PORTS = 4096

_ERROR = re.compile(r'^\s*([+-]?\d+)\s*,\s*"?(.*?)"?\s*$')
_LIST = re.compile(r"\(@([^)]*)\)")


def channel_list(ports: Iterable[int]) -> str:
    """``[1, 2, 3]`` → ``(@1,2,3)``; an empty iterable gives the legal empty list ``(@)``."""
    return "(@" + ",".join([str(p) for p in ports]) + ")"


def parse_channel_lists(text: str, *, command: str = "", instrument: str | None = None,
                        limit: int = MAX_LIST_PORTS) -> list[list[int]]:
    """``(@1,2),(@17,18)`` → ``[[1, 2], [17, 18]]``; ``(@)`` → ``[[]]``. Ranges ``a:b`` expand,
    after their ends are checked against ``1..limit``; a list of more than ``limit`` ports is
    refused (a device's reply never costs more than its size)."""
    lists = _LIST.findall(text)
    if not lists or _LIST.sub("", text).replace(",", "").strip():
        raise ProtocolError(f"{command!r} answered {shown(text, 120)}, not an SCPI channel list",
                            instrument=instrument)
    result = []
    for body in lists:
        ports: list[int] = []
        for item in filter(None, (x.strip() for x in body.split(","))):
            first, _, last = item.partition(":")
            lo = reply_int(first, command, instrument, what="a port number")
            hi = reply_int(last, command, instrument, what="a port number") if last else lo
            if not (1 <= lo <= limit and 1 <= hi <= limit) or len(ports) + hi - lo >= limit:
                raise ProtocolError(f"{command!r} answered ports {lo}..{hi}: more than the "
                                    f"{limit} ports a list may hold", instrument=instrument)
            ports.extend(range(lo, hi + 1))
        result.append(ports)
    return result


def program_message(*units: str) -> str:
    """Join program message units with ``;``, writing each header relative to the previous
    one where they share a parent node (standard SCPI path context), so that
    ``(":SENS1:POW:WAV 1550NM", ":SENS1:POW:UNIT 0")`` becomes
    ``:SENS1:POW:WAV 1550NM;UNIT 0``. Common commands (``*OPC?``) leave the context alone.
    """
    out: list[str] = []
    context: list[str] | None = None  # parent node of the previous unit, upper-cased
    for unit in units:
        header, sep, args = unit.strip().partition(" ")
        if header.startswith("*"):
            out.append(unit.strip())
            continue
        nodes = header.lstrip(":").split(":")
        parent = [n.upper() for n in nodes[:-1]]
        if context is not None and out and parent[: len(context)] == context and context:
            text = ":".join(nodes[len(context):])
        else:
            text = ":" + ":".join(nodes)
        out.append(text + sep + args)
        context = parent
    return ";".join(out)


def _no_error(entry: str) -> bool:
    """Whether an error-queue entry is plainly code 0 (``0,"No error"``, ``+0, ...``):
    the answer to nearly every command, told without the full parse."""
    code, comma, _ = entry.strip().partition(",")
    return bool(comma) and code in ("0", "+0", "-0")


def parse_error(text: str, *, command: str = ":SYST:ERR?",
                instrument: str | None = None) -> tuple[int, str]:
    """``-113, "Undefined header"`` (or ``+0,"No error"``) → ``(-113, "Undefined header")``."""
    match = _ERROR.match(text)
    if not match:
        raise ProtocolError(f"{command!r} answered {shown(text, 120)}, not an SCPI error-queue "
                            "entry", instrument=instrument)
    return reply_int(match.group(1), command, instrument, what="an error code"), match.group(2)


def split_answers(line: str) -> list[str]:
    """Split an IEEE 488.2 joined answer on ``;`` outside double quotes."""
    parts = line.split(";")
    if '"' not in line:
        return parts
    for part in parts:  # (a loop, not all() over a generator: on every reply)
        if part.count('"') % 2:
            break
    else:
        return parts  # no ``;`` inside a quoted string: the plain split is the answer
    parts = []
    current: list[str] = []
    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


async def query_all(link: Link, message: str, count: int) -> list[str]:
    """Send one program message holding ``count`` queries; return the ``count`` answers,
    whether the device joins them on one line or sends one line each."""
    await link.write_query(message)
    answers: list[str] = []
    while len(answers) < count:
        answers.extend(split_answers(await link.read_line()))
    if len(answers) != count:
        raise ProtocolError(f"expected {count} answers to {message!r}, got {answers!r}",
                            instrument=link.name)
    return answers


async def identify(link: Link) -> tuple[str, str, str, str]:
    """``*IDN?`` → (vendor, model, serial, firmware)."""
    idn = await link.query("*IDN?")
    fields = [f.strip() for f in idn.split(",")]
    if len(fields) < 4:
        raise ProtocolError(f"*IDN? answer {idn!r} has fewer than 4 fields",
                            instrument=link.name)
    return fields[0], fields[1], fields[2], fields[3]


async def operation_complete(link: Link) -> None:
    """``*OPC?`` → ``1``: the cheapest exchange that proves an SCPI device is there."""
    reply = (await link.query("*OPC?")).strip()
    if reply not in ("1", "+1"):
        raise ProtocolError(f"*OPC? answered {reply[:80]!r}, expected 1", instrument=link.name)


async def same_identity(link: Link, serial: str, firmware: str) -> None:
    """``*IDN?`` again: the same serial and firmware, or the device is another one now
    (swapped, or restarted on new firmware): :class:`DeviceRestarted`."""
    _, _, now_serial, now_firmware = await identify(link)
    if (now_serial, now_firmware) != (serial, firmware):
        raise DeviceRestarted(f"*IDN? now gives serial {now_serial!r}, firmware "
                              f"{now_firmware!r} (was {serial!r}, {firmware!r}): the device "
                              "restarted or was replaced", instrument=link.name)


async def _raise_queued(link: Link, entry: str, command: str) -> None:
    """Raise the device's error for ``command`` if the error-queue ``entry`` holds one,
    after emptying the rest of the queue (so no stale error is blamed on a later
    command)."""
    code, text = parse_error(entry, command=command, instrument=link.name)
    if code != 0:
        await drain_errors(link)
        raise DeviceError(code, text, command=command, instrument=link.name)


async def command_checked(link: Link, command: str) -> None:
    """Run a command, wait until the device has completed it (``*OPC?``) and raise
    :class:`DeviceError` if it queued an error. One round trip."""
    message = f"{command};*OPC?;:SYST:ERR?"
    await link.write_query(message)
    answers = split_answers(await link.read_line())
    # Check the first answer before waiting for a second line: a garbled reply must fail
    # now, not after the timeout.
    if answers[0].strip() != "1":
        raise ProtocolError(f"*OPC? answered {answers[0]!r} to {message!r}, expected 1",
                            instrument=link.name)
    if len(answers) == 1:
        answers.extend(split_answers(await link.read_line()))
    if len(answers) != 2:
        raise ProtocolError(f"expected 2 answers to {message!r}, got {answers!r}",
                            instrument=link.name)
    if not _no_error(answers[1]):
        await _raise_queued(link, answers[1], command)


async def query_checked(link: Link, query: str, *, timeout: float | None = None) -> str:
    """Ask one query and the error queue in one message. A query the device refuses has no
    answer, only its error; so the reply is either ``value`` + ``0, "No error"`` (joined or
    on two lines) or a lone error entry, which raises :class:`DeviceError`."""
    message = f"{query};:SYST:ERR?"
    await link.write_query(message)
    answers = split_answers(await link.read_line(timeout=timeout))
    if len(answers) == 1 and _ERROR.match(answers[0]) and '"' in answers[0]:
        await _raise_queued(link, answers[0], query)
        raise ProtocolError(f"{query!r} got no answer, only {answers[0]!r}",
                            instrument=link.name)
    if len(answers) == 1:
        answers.extend(split_answers(await link.read_line(timeout=timeout)))
    if len(answers) != 2:
        raise ProtocolError(f"expected 2 answers to {message!r}, got {answers!r}",
                            instrument=link.name)
    await _raise_queued(link, answers[1], query)
    return answers[0]


async def query_block(link: Link, query: str, *, timeout: float | None = None) -> bytes:
    """Ask a query whose answer is an IEEE 488.2 definite-length block
    (``#<d><length><bytes>``), with the error queue in the same message: a refused query
    raises :class:`DeviceError` at once instead of leaving the caller to time out."""
    await link.write_query(f"{query};:SYST:ERR?")
    head = await link.read_exactly(2, timeout=timeout)
    if head[:1] != b"#":
        rest = await link.read_line(timeout=timeout)
        entry = split_answers(head.decode("latin-1") + rest)[-1]
        await _raise_queued(link, entry, query)
        raise ProtocolError(f"{query!r} got no block, only {entry!r}", instrument=link.name)
    if not head[1:2].isdigit() or head[1:2] == b"0":
        raise ProtocolError(f"expected a definite-length block, got {head!r}",
                            instrument=link.name)
    digits = await link.read_exactly(int(head[1:2]), timeout=timeout)
    length = reply_int(digits.decode("latin-1"), query, link.name, what="a block length")
    if not 0 <= length <= BUFFER_LIMIT:
        raise ProtocolError(f"{query!r} announced a block of {length} bytes, over the "
                            f"{BUFFER_LIMIT}-byte limit", instrument=link.name)
    payload = await link.read_exactly(length, timeout=timeout)
    tail = await link.read_line(timeout=timeout)  # ';<error entry>' or a line end
    answers = [a for a in split_answers(tail) if a.strip()]
    if not answers:
        answers = split_answers(await link.read_line(timeout=timeout))
    await _raise_queued(link, answers[-1], query)
    return payload


async def drain_errors(link: Link, limit: int = 32) -> list[tuple[int, str]]:
    """Pop the error queue until it reports no error (so stale errors cannot be blamed on
    the next command)."""
    found = []
    for _ in range(limit):
        code, text = parse_error(await link.query(":SYST:ERR?"), instrument=link.name)
        if code == 0:
            break
        found.append((code, text))
    return found


def parse_floats(text: str, *, command: str = "", instrument: str | None = None) -> list[float]:
    """``(-12.3,-40.0)`` or ``-12.3,-40.0`` → floats."""
    body = text.strip().strip("()")
    return [reply_float(v, command, instrument) for v in body.split(",") if v.strip()]


def parse_tokens(text: str) -> Sequence[str]:
    return [t.strip() for t in text.strip().strip("()").split(",") if t.strip()]
