"""TL1 (Telcordia GR-831) framing: commands, response blocks, ctag matching, login.

A response block on the wire::

    \\r\\n\\n   SID YY-MM-DD HH:MM:SS\\r\\nM  <ctag> COMPLD\\r\\n   "<data>"\\r\\n;

The block ends at a line holding only ``;`` — read up to ``\\n;``, never to the next line end,
since a device may send nothing after the ``;`` until its next message. Autonomous messages
(``A``, ``*C``, ``**``, ``*`` headers) may arrive at any time, between or before responses; they
are handed to a callback. ``IP``/``PF`` acknowledgements (ending in ``<``) are skipped, as are
prompt lines some devices print (``agent> ``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from instruments.errors import AuthenticationError, DeviceError, InstrumentTimeout, ProtocolError
from instruments.link import Link
from instruments.numbers import reply_int

_HEADER = re.compile(
    r"^\s+(?P<sid>.*?)\s+(?P<date>\d{2,4}-\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})\s*$"
)
_RESPONSE = re.compile(r"^M\s+(?P<ctag>\S+)\s+(?P<status>COMPLD|DENY|PRTL|DELAY|RTRV)\b")
_AUTONOMOUS = re.compile(r"^(?P<code>\*C|\*\*|\*|A)\s+(?P<atag>\S+)\s+(?P<verb>.*)$")
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+\S+\s*$")
_PROMPT = re.compile(r"^[\w.-]*[>]\s?")
_COMMENT = re.compile(r"^\s*/\*\s?(.*?)\s?\*/\s*$")

#: Most ports a TL1 port list may name when the device's size is not known.
MAX_LIST_PORTS = 4096
NOT_LOGGED_IN = ("not logged in", "login not active")


@dataclass
class Tl1Message:
    """One parsed output block: a response (``ctag`` set) or an autonomous message."""

    kind: str  # "response" or "autonomous"
    tag: str
    status: str  # COMPLD, DENY, ... or the autonomous verb line (e.g. "REPT ALM EQPT")
    sid: str = ""
    lines: list[str] = field(default_factory=list)
    code: str = ""
    comment: str = ""
    alarm: str = ""  # *C, **, *, A for autonomous messages

    @property
    def ok(self) -> bool:
        return self.status == "COMPLD"


def format_command(verb: str, *, tid: str = "", aid: str = "", ctag: int | str = 1,
                   gb: str = "", params: str = "") -> str:
    """``VERB:TID:AID:CTAG:GB:PARAMS;`` with empty trailing blocks kept as TL1 expects."""
    text = f"{verb}:{tid}:{aid}:{ctag}:{gb}"
    if params:
        text += f":{params}"
    return text + ";"


def _unquote(line: str) -> str:
    line = line.strip()
    if len(line) >= 2 and line[0] == '"' and line[-1] == '"':
        return line[1:-1]
    return line


def parse_block(text: str) -> list[Tl1Message]:
    """Parse the text up to and including a ``;`` terminator into messages.

    Returns one message normally; stray acknowledgements are dropped.
    Raises :class:`ProtocolError` for a block without an identifiable response line.
    """
    lines = [_PROMPT.sub("", ln.rstrip("\r")) for ln in text.split("\n")]
    lines = [ln for ln in lines if ln.strip() and ln.strip() not in (";", "<")]
    lines = [ln for ln in lines if not _ACK.match(ln)]
    sid = ""
    messages: list[Tl1Message] = []
    current: Tl1Message | None = None
    for ln in lines:
        header = _HEADER.match(ln)
        if header and current is None:
            sid = header.group("sid").strip('"')
            continue
        resp = _RESPONSE.match(ln)
        if resp and current is None:
            current = Tl1Message("response", resp.group("ctag"), resp.group("status"), sid)
            messages.append(current)
            continue
        auto = _AUTONOMOUS.match(ln)
        if auto and current is None:
            current = Tl1Message("autonomous", auto.group("atag"), auto.group("verb").strip(),
                                 sid, alarm=auto.group("code"))
            messages.append(current)
            continue
        if current is None:
            raise ProtocolError(f"TL1 block without a response line: {text!r}")
        comment = _COMMENT.match(ln)
        stripped = ln.strip()
        if comment:
            current.comment = (current.comment + " " + comment.group(1)).strip()
        elif current.status == "DENY" and not current.code and not stripped.startswith('"'):
            current.code = stripped.split()[0]
        else:
            current.lines.append(_unquote(stripped))
    if not messages:
        raise ProtocolError(f"empty TL1 block: {text!r}")
    return messages


class Tl1Session:
    """Numbers ctags, sends commands, and matches each reply by ctag on a :class:`Link`.

    Not re-entrant by itself: the connection's lock keeps one command on the wire.
    """

    def __init__(self, *, tid: str = "", on_autonomous: Callable[[Tl1Message], None] | None = None,
                 ctag_start: int = 1) -> None:
        self.tid = tid
        self.on_autonomous = on_autonomous
        self._ctag = ctag_start - 1

    def next_ctag(self) -> int:
        self._ctag = self._ctag % 999999 + 1
        return self._ctag

    async def read_message(self, link: Link, *, timeout: float | None = None) -> Tl1Message:
        """Read blocks until one response (autonomous messages go to the callback)."""
        while True:
            raw = await link.read_until(b"\n;", timeout=timeout)
            try:
                text = raw.decode(link.settings.encoding)
            except UnicodeDecodeError:
                raise ProtocolError(f"TL1 reply is not text: {raw!r}",
                                    instrument=link.name) from None
            for message in parse_block(text):
                if message.kind == "autonomous":
                    if self.on_autonomous is not None:
                        self.on_autonomous(message)
                    continue
                return message

    async def command(self, link: Link, verb: str, *, aid: str = "", gb: str = "",
                      params: str = "", timeout: float | None = None,
                      check: bool = True, secret: str | None = None) -> Tl1Message:
        """Send one command and return its response; DENY raises :class:`DeviceError`.
        ``secret`` (a password in ``params``) is masked in the wire log."""
        ctag = self.next_ctag()
        text = format_command(verb, tid=self.tid, aid=aid, ctag=ctag, gb=gb, params=params)
        await link.write_query(text, secret=secret)
        limit = link.settings.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            # One deadline for the whole command, however many other blocks arrive first.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InstrumentTimeout(f"no response to ctag {ctag} within {limit:g} s",
                                        instrument=link.name)
            reply = await self.read_message(link, timeout=remaining)
            if reply.tag == str(ctag):
                break
            # A reply to an earlier command (one that timed out) arriving late: not ours.
        if check and reply.status == "DENY":
            raise deny_error(reply, verb, link.name)
        return reply

    async def login(self, link: Link, user: str, password: str) -> Tl1Message:
        """``ACT-USER``; "Already logged in" counts as success."""
        reply = await self.command(link, "ACT-USER", aid=user, params=password, check=False,
                                   secret=password)
        already = "already logged in" in (reply.comment + " ".join(reply.lines)).lower()
        if reply.status == "DENY" and not already:
            raise AuthenticationError(reply.code or "DENY", reply.comment or "login refused",
                                      command="ACT-USER", instrument=link.name)
        return reply


def deny_error(reply: Tl1Message, verb: str, instrument: str) -> DeviceError:
    text = reply.comment or " ".join(reply.lines)
    cls = AuthenticationError if (
        reply.code == "PICC" or any(s in text.lower() for s in NOT_LOGGED_IN)
    ) else DeviceError
    return cls(reply.code or "DENY", text, command=verb, instrument=instrument)


def aid_list(ports: list[str] | list[int]) -> str:
    """``[1, 3, 7]`` → ``1&3&7``."""
    return "&".join(str(p) for p in ports)


def parse_aid_list(text: str, limit: int = MAX_LIST_PORTS,
                   instrument: str | None = None) -> list[int]:
    """``1&3&7`` → ``[1, 3, 7]``; ``1&&4`` is the inclusive range 1..4 (mixable: ``1&&3&9``).
    Range ends are checked against ``1..limit`` before a range expands, and a list of more
    than ``limit`` ports is refused."""
    tokens = text.split("&")
    ports: list[int] = []
    i = 0
    while i < len(tokens):
        ranged = i + 2 < len(tokens) and tokens[i + 1] == ""
        lo = reply_int(tokens[i], "TL1 port list", instrument, what="a port number")
        hi = reply_int(tokens[i + 2], "TL1 port list", instrument,
                       what="a port number") if ranged else lo
        if not (1 <= lo <= limit and 1 <= hi <= limit) or len(ports) + hi - lo >= limit:
            raise ProtocolError(f"TL1 port list names ports {lo}..{hi}: more than the "
                                f"{limit} ports a list may hold", instrument=instrument)
        ports.extend(range(lo, hi + 1))
        i += 3 if ranged else 1
    return ports
