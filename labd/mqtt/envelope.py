"""Signed messages. Where the broker is open, anyone on it can publish on any topic; labd
believes a message only when it is sealed with the sender's key (docs/daemon.md, "Who may
speak on the bus").

A sealed payload is a JSON object::

    {"v": 1, "from": "h1", "session": "9f2c...", "seq": 17, "ts_ns": 1764590000123456789,
     "body": "<the message itself, as text>", "mac": "<hex HMAC-SHA256>"}

The MAC covers the topic too, so a message cannot be moved to another host's topic or
another kind. ``session`` is new each time a sender connects and ``seq`` rises within it:
an :class:`Opener` takes a message only if it is newer than the last one it took from that
sender on that topic, so a captured message is refused when played again. ``ts_ns`` (the
sender's wall clock) bounds how old a message from a session not yet seen may be.

A last will is sealed when its session starts, with the highest ``seq`` (:data:`LAST`): it
is taken once, and only from the session it belongs to.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from labd.errors import AlreadyTaken, PayloadError, RefusedMessage
from labd.mqtt.payload import check, loads

VERSION = 1
#: The ``seq`` of a last will: the last word of its session.
LAST = 2**53 - 1
#: How far a sender's clock may be from ours before its message is called stale.
MAX_SKEW_S = 60.0
KEY_BYTES = 32


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _mac(key: bytes, topic: str, sender: str, session: str, seq: int, ts_ns: int,
         body: str) -> str:
    signed = f"labd-mqtt-{VERSION}\n{topic}\n{sender}\n{session}\n{seq}\n{ts_ns}\n{body}"
    # surrogatepass: a body may hold any code point JSON can carry, lone surrogates too.
    return hmac.new(key, signed.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


class Sealer:
    """Seals what one sender publishes, in one session (a new Sealer per connection)."""

    def __init__(self, sender: str, key: bytes) -> None:
        self.sender, self.key = sender, key
        self.session = secrets.token_hex(8)
        self._seq = 0
        self._last_ts = 0

    def seal(self, topic: str, body: bytes | str, *, last: bool = False) -> bytes:
        text = body.decode() if isinstance(body, bytes) else body
        self._seq += 1
        seq = LAST if last else self._seq
        # Our stamps rise within the session even if the wall clock steps back.
        ts_ns = self._last_ts = max(time.time_ns(), self._last_ts + 1)
        mac = _mac(self.key, topic, self.sender, self.session, seq, ts_ns, text)
        return (f'{{"v":{VERSION},"from":"{self.sender}","session":"{self.session}",'
                f'"seq":{seq},"ts_ns":{ts_ns},"body":{json.dumps(text)},"mac":"{mac}"}}').encode()


@dataclass
class _Seen:
    session: str
    seq: int
    ts_ns: int


class Opener:
    """Checks sealed messages against the senders' keys (``key_of(sender)``, None for a
    sender it does not know) and remembers, per sender and topic, the newest it took."""

    def __init__(self, key_of: Callable[[str], bytes | None], *,
                 max_skew_s: float = MAX_SKEW_S) -> None:
        self._key_of = key_of
        self.max_skew_ns = int(max_skew_s * 1e9)
        self._seen: dict[tuple[str, str], _Seen] = {}

    def open(self, topic: str, payload: bytes, *, sender: str | None = None,
             retained: bool = False) -> tuple[str, str]:
        """(sender, body) of a sealed message; :class:`RefusedMessage` (or
        :class:`PayloadError`) when it is not sealed by ``sender`` (when given) with its
        key, or is older than one already taken. A retained message may be old: it was
        kept by the broker, not played again."""
        check(payload, what="message")  # too large or too deep: a PayloadError as it is
        try:
            sealed = loads(payload, what="message")
        except PayloadError as exc:
            raise RefusedMessage(f"unsigned message ({exc})") from None
        if not isinstance(sealed, dict) or "mac" not in sealed:
            raise RefusedMessage("unsigned message: it has no 'mac'")
        claimed, session, seq = sealed.get("from"), sealed.get("session"), sealed.get("seq")
        ts_ns, body, mac = sealed.get("ts_ns"), sealed.get("body"), sealed.get("mac")
        if (sealed.get("v") != VERSION or not isinstance(claimed, str)
                or not isinstance(session, str) or type(seq) is not int
                or type(ts_ns) is not int or not isinstance(body, str)
                or not isinstance(mac, str)):
            raise RefusedMessage("malformed seal: expected v, from, session, seq, ts_ns, "
                                 "body and mac")
        if sender is not None and claimed != sender:
            raise RefusedMessage(f"sealed by {claimed!r}, not by {sender!r} whose topic it is")
        key = self._key_of(claimed)
        if key is None:
            raise RefusedMessage(f"no key for {claimed!r}")
        if not hmac.compare_digest(mac, _mac(key, topic, claimed, session, seq, ts_ns, body)):
            raise RefusedMessage(f"bad signature (not sealed with {claimed!r}'s key)")
        seen = self._seen.get((claimed, topic))
        if seen is not None and session == seen.session:
            if seq == seen.seq:
                raise AlreadyTaken(f"replayed message (seq {seq}, taken already)")
            if seq < seen.seq:
                raise RefusedMessage(f"replayed message (seq {seq}, already at {seen.seq})")
        else:
            if seen is not None and ts_ns <= seen.ts_ns:
                raise RefusedMessage("replayed message from an earlier session")
            if not retained and abs(time.time_ns() - ts_ns) > self.max_skew_ns:
                raise RefusedMessage(
                    f"stale message: stamped {(time.time_ns() - ts_ns) / 1e9:+.0f} s from "
                    f"now (more than {self.max_skew_ns / 1e9:.0f} s; are the clocks set?)")
        self._seen[(claimed, topic)] = _Seen(session, seq, ts_ns)
        return claimed, body
