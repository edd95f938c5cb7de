"""Limits on what the bus parses. A payload is checked for size and for how deeply it nests
before ``json.loads`` sees it: a hostile message (``["`` a hundred thousand times) would
otherwise reach the parser's recursion limit, and megabytes of JSON would be read into
memory only to be refused."""

from __future__ import annotations

import json
import re
from typing import Any

from labd.errors import PayloadError

#: The largest message labd takes from the bus. An agent's heartbeat with 64 GPUs is about
#: 10 KiB; a command replacing a 384x384 map about 6 KiB.
MAX_BYTES = 256 * 1024

#: The deepest nesting a message may have. labd's own messages nest 4 deep.
MAX_DEPTH = 32

# A string, or an unclosed one to the end. Possessive, so that the scan is linear: with
# backtracking, `"\` repeated made every quote scan to the end again (minutes for 256 KiB).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets


def check(payload: bytes, *, what: str = "payload", max_bytes: int = MAX_BYTES,
          max_depth: int = MAX_DEPTH) -> None:
    """Refuse a payload that is too large or nests too deeply, before it is parsed."""
    if len(payload) > max_bytes:
        raise PayloadError(f"{what} is {len(payload):,} bytes; at most {max_bytes:,} are "
                           "taken")
    # Cheap first: a payload with few brackets cannot nest deeply.
    if payload.count(b"[") + payload.count(b"{") <= max_depth:
        return
    # Strings may hold brackets; take them out (at C speed), then walk the brackets left.
    depth = deepest = 0
    for byte in _STRING.sub(b"", payload).translate(None, _BRACKETS):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    if deepest > max_depth:
        raise PayloadError(f"{what} nests {deepest} deep; at most {max_depth} levels are "
                           "taken")


def loads(payload: bytes | str, *, what: str = "payload") -> Any:
    """``json.loads`` within the limits; any mistake is a :class:`PayloadError`."""
    raw = payload.encode() if isinstance(payload, str) else payload
    check(raw, what=what)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PayloadError(f"{what} is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"{what} is not JSON: {exc}") from None
