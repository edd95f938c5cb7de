"""The device side of TL1: command parsing, GR-831 output framing, login, DENY codes."""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from emulators.wire.server import Session

CRLF = "\r\n"


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
    """``5``, ``1&3&7``, ``1&&640`` (inclusive range, mixable) → ports; DENY IIAC otherwise."""
    tokens = aid.split("&")
    ports: list[int] = []
    i = 0
    try:
        while i < len(tokens):
            if i + 2 < len(tokens) and tokens[i + 1] == "":
                ports.extend(range(int(tokens[i]), int(tokens[i + 2]) + 1))
                i += 3
            else:
                ports.append(int(tokens[i]))
                i += 1
    except ValueError:
        raise Deny("IIAC", f"Invalid AID {aid!r}") from None
    for p in ports:
        if not 1 <= p <= limit:
            raise Deny("IIAC", f"Invalid AID: port {p} out of range 1..{limit}")
    return ports


def keyword_params(params: str) -> dict[str, str]:
    out = {}
    for item in params.split(","):
        key, sep, value = item.partition("=")
        if sep:
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
        if not ctag or not ctag.replace(".", "").isalnum():
            return self.reply(ctag or "0", deny=Deny("IICT", "Invalid correlation tag"))
        if command.tid and command.tid.strip('"') != self.sid:
            return self.reply(ctag, deny=Deny("IITA", f"Invalid target identifier {command.tid}"))
        handler = self.verbs.get(command.verb)
        if handler is None:
            return self.reply(ctag, deny=Deny("IICM", f"Invalid command {command.verb}"))
        if self.user is None and command.verb not in self.public_verbs:
            return self.reply(ctag, deny=Deny(self.not_logged_in_code, "Not logged in"))
        try:
            lines = await handler(command, arrived_ns)
        except Deny as deny:
            return self.reply(ctag, deny=deny)
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
