"""The device side of SCPI: a command tree with long/short mnemonics, ``;`` compound
messages with relative headers, numeric suffixes (``SENS2``), the error queue, and
IEEE 488.2 reply joining (or one line per answer, a per-device option)."""

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


@dataclass(frozen=True)
class _Command:
    nodes: tuple[_Node, ...]
    query: bool
    handler: Handler


def split_units(message: str) -> list[str]:
    """Split a program message on ``;`` outside quotes and parentheses."""
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


class ScpiEngine:
    """A command table plus the per-session parse state lives in :class:`ScpiSessionState`."""

    def __init__(self) -> None:
        self._commands: list[_Command] = []
        # Header → command, remembered: a reply is not sent before its program message's
        # last query is found, so a scan of the table per query would be device time.
        self._found: dict[tuple[tuple[str, ...], bool], tuple[_Command, list[int]] | None] = {}

    def register(self, pattern: str, handler: Handler) -> None:
        """``pattern`` like ``:OXC:SWITch:CONNect:STATe?``; lower-case letters are the part a
        client may leave out. Handlers take ``(args: str, suffixes: list[int])``."""
        query = pattern.endswith("?")
        self._commands.append(_Command(_nodes(pattern), query, handler))
        self._found.clear()

    def find(self, tokens: list[str], query: bool) -> tuple[_Command, list[int]] | None:
        key = (tuple(tokens), query)
        if sum(map(len, tokens)) > _HEADER_CACHED:
            return self._lookup(tokens, query)
        if key not in self._found:
            if len(self._found) >= _FOUND_LIMIT:  # a client sending endless new headers
                self._found.clear()
            self._found[key] = self._lookup(tokens, query)
        found = self._found[key]
        return None if found is None else (found[0], list(found[1]))

    def _lookup(self, tokens: list[str], query: bool) -> tuple[_Command, list[int]] | None:
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
                return command, [n for _, n in parsed]
        return None


class ScpiSessionState:
    """Error queue and reply policy of one connection."""

    def __init__(self, engine: ScpiEngine, *, error_format: str = '{code}, "{text}"',
                 joined_replies: bool = True) -> None:
        self.engine = engine
        self.errors: deque[tuple[int, str]] = deque()
        self.error_format = error_format
        self.joined_replies = joined_replies

    def push_error(self, code: int, text: str) -> None:
        if len(self.errors) >= QUEUE_LENGTH:
            self.errors[-1] = (-350, "Queue overflow")
            return
        self.errors.append((code, text))

    def pop_error(self) -> str:
        code, text = self.errors.popleft() if self.errors else (0, "No error")
        return self.format_error(code, text)

    def format_error(self, code: int, text: str) -> str:
        return self.error_format.format(code=code, text=text, signed=f"{code:+d}")

    async def execute(self, message: str) -> list[str | bytes]:
        """Run every unit of a program message; return the answers of its queries."""
        answers: list[str | bytes] = []
        context: list[str] = []
        for index, unit in enumerate(split_units(message)):
            header, _, args = unit.partition(" ")
            query = header.endswith("?")
            header = header.rstrip("?")
            if header.startswith("*"):
                candidates = [[header]]
            elif header.startswith(":") or index == 0:
                candidates = [header.lstrip(":").split(":")]
            else:
                # Relative header: resolved under the previous command's parent node.
                rel = header.split(":")
                candidates = [context + rel, rel] if context else [rel]
            found = None
            for tokens in candidates:
                found = self.engine.find(tokens, query)
                if found:
                    if not header.startswith("*"):
                        context = tokens[:-1]
                    break
            if found is None:
                self.push_error(-113, "Undefined header")
                continue
            command, suffixes = found
            try:
                result = command.handler(args.strip(), suffixes)
                if inspect.isawaitable(result):
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
            if query:
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


def parse_lists(args: str, limit: int) -> list[list[int]]:
    """The device's reading of ``(@1,2),(@17,18)``: lists of ports; ``(@)`` is empty.
    Every port and both ends of every range ``a:b`` are checked against ``1..limit`` before
    a range is expanded, and a list naming more than ``limit`` ports is refused (it would
    name some twice): what a client writes never costs more than the device's size.
    Raises ScpiError -104/-109 on anything else, -222 for a port out of range."""
    text = args.strip()
    if not text:
        raise ScpiError(-109, "Missing parameter")
    lists = []
    pos = 0
    pattern = re.compile(r"\s*\(@([^)]*)\)\s*(,|$)")
    while pos < len(text):
        match = pattern.match(text, pos)
        if not match:
            raise ScpiError(-104, "Data type error; expected a channel list (@...)")
        body = match.group(1).strip()
        ports: list[int] = []
        if body and _PLAIN_LIST.fullmatch(body):
            # The common case, a list of plain port numbers (a whole map is 768 of them):
            # each is at most nine digits, so converting costs nothing unbounded.
            ports = list(map(int, body.split(",")))
            if len(ports) > limit:
                raise ScpiError(-224, f"Illegal parameter value; more than {limit} ports in "
                                "one list")
            if min(ports) < 1 or max(ports) > limit:
                end = next(p for p in ports if not 1 <= p <= limit)
                raise ScpiError(-222, f"Data out of range; port {end} out of range "
                                f"1..{limit}")
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
