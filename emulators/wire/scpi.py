"""The device side of SCPI: a command tree with long/short mnemonics, optional nodes
(``[:COUNt]``), ``;`` compound messages with relative headers, numeric suffixes (``SENS2``),
enumerated values in long or short form, the error queue, and IEEE 488.2 reply joining (or
one line per answer, a per-device option)."""

from __future__ import annotations

import inspect
import logging
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from emulators.wire.numbers import (
    MAX_MESSAGE_BYTES,
    MAX_NUMBER_CHARS,
    shown,
    wire_float,
    wire_int,
)
from emulators.wire.server import Session

Handler = Callable[..., object]  # returns str | None, or an awaitable of it
_MNEMONIC = re.compile(r"^([A-Za-z*][A-Za-z_]*?)(\d{0,9})$", re.ASCII)
log = logging.getLogger(__name__)
QUEUE_LENGTH = 32
_FOUND_LIMIT = 4096
_HEADER_CACHED = 128  # longer headers are looked up each time: the cache stays small
_OPTIONAL = re.compile(r"\[(:[A-Za-z*]+)\]")


class ScpiError(Exception):
    """A command error or execution error; goes on the error queue."""

    def __init__(self, code: int, text: str) -> None:
        self.code, self.text = code, text
        super().__init__(f"{code}, {text}")


@dataclass(frozen=True)
class _Node:
    short: str
    long: str

    def matches(self, token: str) -> bool:
        token = token.upper()
        return token in (self.short, self.long)


def _nodes(pattern: str) -> tuple[_Node, ...]:
    out = []
    for part in pattern.strip(":").split(":"):
        short = "".join(ch for ch in part if ch.isupper() or ch in "*?") or part.upper()
        out.append(_Node(short.rstrip("?"), part.upper().rstrip("?")))
    return tuple(out)


def optional_variants(pattern: str) -> list[str]:
    """Every spelling of a pattern with optional nodes, each ``[:NODE]`` present or not."""
    groups = _OPTIONAL.findall(pattern)
    if not groups:
        return [pattern]
    parts = _OPTIONAL.split(pattern)  # text, group, text, group, ..., text
    out = []
    for mask in range(1 << len(groups)):
        text = parts[0]
        for i, group in enumerate(groups):
            text += (group if mask >> i & 1 else "") + parts[2 * i + 2]
        out.append(text)
    return out


def parse_enum(text: str, choices: tuple[str, ...]) -> str:
    """``CMEASURE`` or ``CME`` with ``choices=("CMEasure", …)``: the choice it names, in
    its short (upper-case) form. Raises ScpiError -224 naming the choices."""
    value = text.strip().upper()
    for choice in choices:
        short = "".join(ch for ch in choice if not ch.islower())
        if value in (short, choice.upper()):
            return short
    raise ScpiError(-224, "Illegal parameter value; expected "
                    + ", ".join("".join(ch for ch in c if not ch.islower()) for c in choices))


@dataclass(frozen=True)
class _Command:
    nodes: tuple[_Node, ...]
    query: bool
    handler: Handler


#: A message with no quotes whose parentheses are flat, closed and hold no ``;`` (a channel
#: list's, the common case): every ``;`` in it separates units.
_PLAIN_MESSAGE = re.compile(r'[^"();]*(?:;[^"();]*|\([^"();]*\)[^"();]*)*', re.ASCII)


def split_units(message: str) -> list[str]:
    """Split a program message on ``;`` outside quotes and parentheses."""
    if _PLAIN_MESSAGE.fullmatch(message):
        return [u for u in map(str.strip, message.split(";")) if u]
    return split_units_by_character(message)


def split_units_by_character(message: str) -> list[str]:
    """:func:`split_units` for any message, one character at a time (the reference the
    quick path of a plain message is tested against)."""
    units: list[str] = []
    current: list[str] = []
    depth, quote = 0, False
    for ch in message:
        if ch == '"':
            quote = not quote
        elif not quote and ch == "(":
            depth += 1
        elif not quote and ch == ")":
            depth = max(0, depth - 1)
        if ch == ";" and not quote and depth == 0:
            units.append("".join(current))
            current = []
        else:
            current.append(ch)
    units.append("".join(current))
    return [u.strip() for u in units if u.strip()]


#: A program unit's header resolved: its command and numeric suffixes (None: undefined),
#: and the path context the next relative header starts from (None: left as it was).
Resolved = tuple[tuple[_Command, tuple[int, ...]] | None, tuple[str, ...] | None]


class ScpiEngine:
    """A command table plus the per-session parse state lives in :class:`ScpiSessionState`."""

    def __init__(self) -> None:
        self._commands: list[_Command] = []
        # Header → command, remembered: a reply is not sent before its program message's
        # last query is found, so a scan of the table per query would be device time.
        self._resolved: dict[tuple[str, tuple[str, ...] | None], Resolved] = {}

    def register(self, pattern: str, handler: Handler) -> None:
        """``pattern`` like ``:OXC:SWITch:CONNect:STATe?``; lower-case letters are the part a
        client may leave out, a node in brackets (``:SENSe:AVERage[:COUNt]``) a node it may
        leave out. Handlers take ``(args: str, suffixes: list[int])``; a node left out
        gives no suffix, so the suffixes of the nodes before it keep their places."""
        query = pattern.endswith("?")
        for variant in optional_variants(pattern):
            self._commands.append(_Command(_nodes(variant), query, handler))
        self._resolved.clear()

    def resolve(self, header: str, first: bool, context: tuple[str, ...]) -> Resolved:
        """The command a unit's ``header`` names, the message's ``first`` unit or one after
        it (whose relative header is read under ``context``, the previous one's parent)."""
        relative = not first and not header.startswith((":", "*"))
        key = (header, context if relative else None)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolve(header, relative, context)
            if len(header) + sum(map(len, key[1] or ())) <= _HEADER_CACHED:
                if len(self._resolved) >= _FOUND_LIMIT:  # a client sending endless new headers
                    self._resolved.clear()
                self._resolved[key] = found
        return found

    def _resolve(self, header: str, relative: bool, context: tuple[str, ...]) -> Resolved:
        query = header.endswith("?")
        header = header.rstrip("?")
        if header.startswith("*"):
            candidates = [[header]]
        elif not relative:
            candidates = [header.lstrip(":").split(":")]
        else:
            # Relative header: resolved under the previous command's parent node.
            rel = header.split(":")
            candidates = [[*context, *rel], rel] if context else [rel]
        for tokens in candidates:
            found = self._lookup(tokens, query)
            if found:
                return found, None if header.startswith("*") else tuple(tokens[:-1])
        return None, None

    def _lookup(self, tokens: list[str], query: bool) -> tuple[_Command, tuple[int, ...]] | None:
        parsed = []
        for token in tokens:
            match = _MNEMONIC.match(token)
            if not match:
                return None
            parsed.append((match.group(1), int(match.group(2)) if match.group(2) else 1))
        for command in self._commands:
            if command.query != query or len(command.nodes) != len(parsed):
                continue
            if all(node.matches(tok) for node, (tok, _) in zip(command.nodes, parsed,
                                                                strict=True)):
                return command, tuple(n for _, n in parsed)
        return None


class ScpiSessionState:
    """Error queue and reply policy of one connection."""

    def __init__(self, engine: ScpiEngine, *, error_format: str = '{code}, "{text}"',
                 joined_replies: bool = True) -> None:
        self.engine = engine
        self.errors: deque[tuple[int, str]] = deque()
        self.error_format = error_format
        self.joined_replies = joined_replies
        self._no_error = ("", "")  # (the format it was made with, the entry)

    def push_error(self, code: int, text: str) -> None:
        if len(self.errors) >= QUEUE_LENGTH:
            self.errors[-1] = (-350, "Queue overflow")
            return
        self.errors.append((code, text))

    def pop_error(self) -> str:
        if not self.errors:  # the answer to nearly every command: formatted once
            if self._no_error[0] != self.error_format:
                self._no_error = (self.error_format, self.format_error(0, "No error"))
            return self._no_error[1]
        return self.format_error(*self.errors.popleft())

    def format_error(self, code: int, text: str) -> str:
        return self.error_format.format(code=code, text=text, signed=f"{code:+d}")

    async def execute(self, message: str) -> list[str | bytes]:
        """Run every unit of a program message; return the answers of its queries."""
        answers: list[str | bytes] = []
        context: tuple[str, ...] = ()
        first = True
        for unit in split_units(message):
            header, _, args = unit.partition(" ")
            found, after = self.engine.resolve(header, first, context)
            first = False
            if found is None:
                self.push_error(-113, "Undefined header")
                continue
            if after is not None:
                context = after
            command, suffixes = found
            try:
                result = command.handler(args.strip(), list(suffixes))
                if result is not None and not isinstance(result, str) and \
                        inspect.isawaitable(result):
                    result = await result
            except ScpiError as exc:
                self.push_error(exc.code, exc.text)
                continue
            except Exception as exc:
                # Whatever a client sends, the session lives on: the unit is refused like
                # any other bad command, and the device's log says what went wrong.
                log.warning("SCPI %s failed: %s: %s", _quote(unit), type(exc).__name__, exc)
                self.push_error(-300, "Device-specific error; command not executed")
                continue
            if command.query:
                answers.append(result if isinstance(result, bytes) else
                               "" if result is None else str(result))
        return answers

    def format_answers(self, answers: list[str | bytes], terminator: str) -> bytes:
        """Answers as the device sends them; a bytes answer (a binary block) goes out as
        it is."""
        if not answers:
            return b""
        parts = [a if isinstance(a, bytes) else a.encode() for a in answers]
        end = terminator.encode()
        if self.joined_replies:
            return b";".join(parts) + end
        return b"".join(p + end for p in parts)


_PLAIN_LIST = re.compile(r"\s*\d{1,9}\s*(?:,\s*\d{1,9}\s*)*", re.ASCII)
_LIST = re.compile(r"\s*\(@([^)]*)\)\s*(,|$)")
#: Lists as a driver writes them, no spaces and no ranges: read without a loop per list.
_TIGHT_LISTS = re.compile(r"\(@(?:\d{1,9}(?:,\d{1,9})*)?\)(?:,\(@(?:\d{1,9}(?:,\d{1,9})*)?\))*",
                          re.ASCII)


def _checked(ports: list[int], limit: int) -> list[int]:
    """A list of plain port numbers (each at most nine digits), checked against the size."""
    if len(ports) > limit:
        raise ScpiError(-224, f"Illegal parameter value; more than {limit} ports in one list")
    if ports and (min(ports) < 1 or max(ports) > limit):
        end = next(p for p in ports if not 1 <= p <= limit)
        raise ScpiError(-222, f"Data out of range; port {end} out of range 1..{limit}")
    return ports


def parse_lists(args: str, limit: int) -> list[list[int]]:
    """The device's reading of ``(@1,2),(@17,18)``: lists of ports; ``(@)`` is empty.
    Every port and both ends of every range ``a:b`` are checked against ``1..limit`` before
    a range is expanded, and a list naming more than ``limit`` ports is refused (it would
    name some twice): what a client writes never costs more than the device's size.
    Raises ScpiError -104/-109 on anything else, -222 for a port out of range."""
    text = args.strip()
    if not text:
        raise ScpiError(-109, "Missing parameter")
    if _TIGHT_LISTS.fullmatch(text):
        return [_checked(list(map(int, body.split(","))) if body else [], limit)
                for body in text[2:-1].split("),(@")]
    return parse_lists_by_list(text, limit)


def parse_lists_by_list(text: str, limit: int) -> list[list[int]]:
    """:func:`parse_lists` of any non-empty stripped text, one list at a time, spaces and
    ranges allowed (the reference the quick path of a driver's tight lists is tested
    against)."""
    lists = []
    pos = 0
    while pos < len(text):
        match = _LIST.match(text, pos)
        if not match:
            raise ScpiError(-104, "Data type error; expected a channel list (@...)")
        body = match.group(1).strip()
        ports: list[int] = []
        if body and _PLAIN_LIST.fullmatch(body):
            # The common case, a list of plain port numbers (a whole map is 768 of them):
            # each is at most nine digits, so converting costs nothing unbounded.
            ports = _checked(list(map(int, body.split(","))), limit)
        elif body:
            for item in body.split(","):
                lo, colon, hi = item.partition(":")
                try:
                    first = wire_int(lo)
                    last = wire_int(hi) if colon else first
                except ValueError:
                    raise ScpiError(-104, f"Data type error; bad channel {_quote(item)}"
                                    ) from None
                for end in (first, last):
                    if not 1 <= end <= limit:
                        raise ScpiError(-222, f"Data out of range; port {end} out of range "
                                        f"1..{limit}")
                if len(ports) + max(0, last - first + 1) > limit:
                    raise ScpiError(-224, f"Illegal parameter value; more than {limit} "
                                    "ports in one list")
                ports.extend(range(first, last + 1))
        lists.append(ports)
        pos = match.end()
    return lists


def _quote(text: str) -> str:
    """Client text in an error message: printable ASCII, cut short (an error queue entry
    stays small)."""
    return shown(text.strip(), 2 * MAX_NUMBER_CHARS)


def format_list(ports: list[int]) -> str:
    return "(@" + ",".join(map(str, ports)) + ")"


def definite_block(payload: bytes) -> bytes:
    """IEEE 488.2 definite-length arbitrary block: ``#<d><length><payload>``."""
    length = str(len(payload))
    return f"#{len(length)}{length}".encode() + payload


_UNIT_SCALE = {"": 1.0, "M": 1.0, "MM": 1e-3, "UM": 1e-6, "NM": 1e-9, "PM": 1e-12,
               "S": 1.0, "MS": 1e-3, "US": 1e-6, "NS": 1e-9, "DBM": 1.0, "W": 1.0,
               "MW": 1e-3, "UW": 1e-6, "NW": 1e-9}
_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]{0,8})\s*$",
                     re.ASCII)


def parse_number(text: str, units: tuple[str, ...] = ()) -> float:
    """``1550NM`` → 1.55e-06 (with ``units=("NM", "M")``): a number with an optional unit
    suffix among ``units``, scaled to the base unit. Raises ScpiError -104/-131."""
    match = _NUMBER.match(text)
    if not match:
        raise ScpiError(-104, f"Data type error; expected a number, got {_quote(text)}")
    unit = match.group(2).upper()
    if unit and unit not in units:
        raise ScpiError(-131, f"Invalid suffix {match.group(2)!r}")
    try:
        value = wire_float(match.group(1))
    except ValueError:
        raise ScpiError(-120, f"Numeric data error; {_quote(match.group(1))} is not a "
                        f"number of at most {MAX_NUMBER_CHARS} characters") from None
    return value * _UNIT_SCALE.get(unit, 1.0)


def parse_bool(text: str) -> bool:
    value = text.strip().upper()
    if value in ("1", "ON"):
        return True
    if value in ("0", "OFF"):
        return False
    raise ScpiError(-104, f"Data type error; expected 0, 1, ON or OFF, got {_quote(text)}")


class ScpiDeviceSession(Session):
    """A session of an SCPI instrument: its command table, its error queue, its replies."""

    terminator = "\n"

    def __init__(self, table: Mapping[str, Handler], *, error_format: str = '{code}, "{text}"',
                 joined_replies: bool = True) -> None:
        engine = ScpiEngine()
        for pattern, handler in table.items():
            engine.register(pattern, handler)
        self.state = ScpiSessionState(engine, error_format=error_format,
                                      joined_replies=joined_replies)
        self.arrived_ns = 0
        """When the message being executed arrived (handlers time their work from it)."""

    def overlong(self) -> bytes | None:
        self.state.push_error(-223, f"Too much data; a message over {MAX_MESSAGE_BYTES} "
                              "bytes was dropped")
        return None

    def failed(self) -> bytes | None:
        self.state.push_error(-300, "Device-specific error; command not executed")
        return None

    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None:
        self.arrived_ns = arrived_ns
        text = message.decode("ascii", "replace").strip()
        if not text:
            return None
        return self.state.format_answers(await self.state.execute(text), self.terminator)
