"""The device side of TL1: command parsing, GR-831 output framing, login, DENY codes."""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from emulators.wire.numbers import MAX_MESSAGE_BYTES, shown, wire_int
from emulators.wire.server import Session

log = logging.getLogger(__name__)
CRLF = "\r\n"
#: A correlation tag longer than this is refused (GR-831 allows six characters).
MAX_CTAG = 32


class Deny(Exception):
    """Refuse the command with a GR-833 code and a comment."""

    def __init__(self, code: str, comment: str) -> None:
        self.code, self.comment = code, comment
        super().__init__(f"{code} {comment}")


@dataclass(frozen=True)
class Tl1Command:
    verb: str  # upper-cased, e.g. ENT-PATCH
    tid: str
    aid: str
    ctag: str
    gb: str
    params: str
    """Everything after the general block: the payload blocks, joined by ``:`` as sent."""

    @property
    def blocks(self) -> list[str]:
        """The payload blocks. GR-831 lets a block be empty (``::``, ``:::``): an empty
        block stands for parameters left out, so ``…:<ctag>::PARAMETER=SIZE;`` and
        ``…:<ctag>:::PARAMETER=SIZE;`` say the same."""
        return [block.strip() for block in split_fields(self.params)]

    @property
    def last_block(self) -> str:
        """The last payload block that is not empty ("" when none is)."""
        return next((block for block in reversed(self.blocks) if block), "")


def split_fields(text: str) -> list[str]:
    """Split on ``:`` outside double quotes."""
    if '"' not in text:
        return text.split(":")
    fields: list[str] = []
    current: list[str] = []
    quote = False
    for ch in text:
        if ch == '"':
            quote = not quote
        if ch == ":" and not quote:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    return fields


def parse_command(message: str) -> Tl1Command:
    text = message.strip().rstrip(";").strip()
    fields = split_fields(text)
    fields += [""] * (6 - len(fields))
    verb, tid, aid, ctag, gb = (f.strip() for f in fields[:5])
    params = ":".join(fields[5:]).strip()
    if not verb:
        raise Deny("IICM", "Empty command")
    return Tl1Command(verb.upper(), tid, aid, ctag, gb, params)


def header(sid: str) -> str:
    return f"{CRLF}\n   {sid} {time.strftime('%y-%m-%d %H:%M:%S')}{CRLF}"


def response(sid: str, ctag: str, lines: list[str] | None = None, *,
             deny: Deny | None = None) -> bytes:
    """A complete output block, ending with the ``;`` line."""
    out = [header(sid)]
    if deny is None:
        out.append(f"M  {ctag} COMPLD{CRLF}")
        out.extend(f'   "{line}"{CRLF}' for line in lines or [])
    else:
        out.append(f"M  {ctag} DENY{CRLF}   {deny.code}{CRLF}   /* {deny.comment} */{CRLF}")
    out.append(";")
    return "".join(out).encode()


def autonomous(sid: str, atag: int, verb_line: str, lines: list[str], alarm: str = "A") -> bytes:
    body = "".join(f'   "{line}"{CRLF}' for line in lines)
    return f"{header(sid)}{alarm:<2} {atag} {verb_line}{CRLF}{body};".encode()


def parse_ports(aid: str, limit: int) -> list[int]:
    """``5``, ``1&3&7``, ``1&&640`` (inclusive range, mixable) → ports; DENY IIAC otherwise.
    Both ends of a range are checked against ``1..limit`` before it is expanded, and a list
    of more than ``limit`` ports (some named twice) is refused with IPNV: what a client
    writes never costs more than the device's size."""
    tokens = aid.split("&")
    ports: list[int] = []
    i = 0
    while i < len(tokens):
        ranged = i + 2 < len(tokens) and tokens[i + 1] == ""
        ends = (tokens[i], tokens[i + 2]) if ranged else (tokens[i], tokens[i])
        try:
            first, last = wire_int(ends[0]), wire_int(ends[1])
        except ValueError:
            raise Deny("IIAC", f"Invalid AID {quoted(aid)}") from None
        for port in (first, last):
            if not 1 <= port <= limit:
                raise Deny("IIAC", f"Invalid AID: port {port} out of range 1..{limit}")
        if len(ports) + max(0, last - first + 1) > limit:
            raise Deny("IPNV", f"Parameter not valid: more than {limit} ports in one list")
        ports.extend(range(first, last + 1))
        i += 3 if ranged else 1
    return ports


def quoted(text: str, limit: int = 64) -> str:
    """Client text in a DENY comment: printable ASCII, cut short, and with no ``*/`` to end
    the comment."""
    return shown(text.replace("*/", "* /"), limit)


def keyword_params(params: str) -> dict[str, str]:
    """``NAME=value`` parameters of a command's payload (:attr:`Tl1Command.params`), in
    whichever of its blocks they are: empty blocks before a keyword block (``::``,
    ``:::``, as GR-831 allows) are skipped, not read as part of a keyword."""
    out = {}
    for block in split_fields(params):
        for item in block.split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                out[key.strip().upper()] = value.strip().strip('"')
    return out


Verb = Callable[[Tl1Command, int], Awaitable[list[str] | None]]


class Tl1Session(Session):
    """Login, TID and ctag checks, then dispatch to ``verbs``; subclasses fill the table."""

    garbage = b"\r\n\n\x15\x8f## M ?? GARBLED \x00\r\n;"
    public_verbs = frozenset({"ACT-USER", "RTRV-HDR"})
    #: Some devices take commands without a ctag (``ACT-CRS::::name;``) and answer with 0.
    allow_empty_ctag = False

    def __init__(self, *, sid: str, users: dict[str, str], autonomous_enabled: bool = True,
                 not_logged_in_code: str = "PICC") -> None:
        self.sid = sid
        self.users = users
        self.user: str | None = None
        self.autonomous_enabled = autonomous_enabled
        self.not_logged_in_code = not_logged_in_code
        self.verbs: dict[str, Verb] = {
            "ACT-USER": self._act_user,
            "CANC-USER": self._canc_user,
            "RTRV-HDR": self._nothing,
        }

    def overlong(self) -> bytes | None:
        return self.reply("0", deny=Deny("IISP", f"Input, invalid syntax: a command over "
                                         f"{MAX_MESSAGE_BYTES} bytes was dropped"))

    def failed(self) -> bytes | None:
        return self.reply("0", deny=Deny("SROF", "Requested operation failed"))

    async def handle(self, message: bytes, arrived_ns: int) -> bytes | None:
        text = message.decode("ascii", "replace")
        if not text.strip(" \r\n\t;"):
            return None
        try:
            command = parse_command(text)
        except Deny as deny:
            return self.reply("0", deny=deny)
        return await self.dispatch(command, arrived_ns)

    async def dispatch(self, command: Tl1Command, arrived_ns: int) -> bytes:
        ctag = command.ctag or ("0" if self.allow_empty_ctag else "")
        if not ctag or len(ctag) > MAX_CTAG or not ctag.replace(".", "").isalnum():
            return self.reply(ctag or "0", deny=Deny("IICT", "Invalid correlation tag"))
        if command.tid and command.tid.strip('"') != self.sid:
            return self.reply(ctag, deny=Deny(
                "IITA", f"Invalid target identifier {quoted(command.tid)}"))
        handler = self.verbs.get(command.verb)
        if handler is None:
            return self.reply(ctag, deny=Deny("IICM", f"Invalid command {quoted(command.verb)}"))
        if self.user is None and command.verb not in self.public_verbs:
            return self.reply(ctag, deny=Deny(self.not_logged_in_code, "Not logged in"))
        try:
            lines = await handler(command, arrived_ns)
        except Deny as deny:
            return self.reply(ctag, deny=deny)
        except Exception as exc:
            # Whatever a client sends, the session lives on: the command is refused like
            # any other bad one, and the device's log says what went wrong.
            log.warning("TL1 %s failed: %s: %s", command.verb[:32], type(exc).__name__, exc)
            return self.reply(ctag, deny=Deny("SROF", "Requested operation failed"))
        return self.reply(ctag, lines)

    def reply(self, ctag: str, lines: list[str] | None = None, *,
              deny: Deny | None = None) -> bytes:
        return response(self.sid, ctag, lines, deny=deny)

    async def _act_user(self, command: Tl1Command, arrived_ns: int) -> list[str] | None:
        user = command.aid
        password = command.params
        if self.users.get(user) != password:
            raise Deny("PICC", "Login failed: invalid user or password")
        if self.user == user:
            raise Deny("SROF", "Already logged in")
        self.user = user
        self.logged_in()
        return None

    def logged_in(self) -> None:
        """Called after a successful ACT-USER."""

    async def _canc_user(self, command: Tl1Command, arrived_ns: int) -> list[str] | None:
        self.user = None
        return None

    async def _nothing(self, command: Tl1Command, arrived_ns: int) -> list[str] | None:
        return None

    @abc.abstractmethod
    def closed(self) -> None: ...
