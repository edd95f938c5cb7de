"""Files for their owner's eyes alone (tokens, keys, the store): created with mode 0600 from
their first byte, never made with the default mode and narrowed after (another user could
open the file in between and keep it open); and the check that says whether others can
read one that is already there.

And the one way labd reads TOML (lab, settings, access and credentials files): whatever the
file holds, it is a dict or one :class:`TomlError` line, never a traceback."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

#: Any permission for the group or others: read, write or execute.
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def create_private(path: str | os.PathLike[str], text: str = "") -> bool:
    """Create ``path`` holding ``text``, mode 0600; False, and the file left as it is, if
    it exists already (another process may have made it meanwhile). OSError for the rest."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return True


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Create or replace ``path`` (and its folders) holding ``text``, mode 0600: a file
    that was there keeps no wider mode."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT keeps an older file's mode
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def open_to_others(mode: int) -> bool:
    """Whether a file of ``mode`` (``st_mode``) grants the group or others anything."""
    return bool(mode & _OTHERS)


def readable_by_others(path: str | os.PathLike[str]) -> bool:
    """Whether users other than its owner may read (or otherwise use) ``path``."""
    return open_to_others(os.stat(path).st_mode)


#: The most bytes of a settings, access or credentials file (each is a few hundred bytes).
MAX_TOML_BYTES = 1 << 20


class TomlError(ValueError):
    """TOML that cannot be read: one line saying why, without the file's name (each caller
    names the file as its user knows it)."""


def loads_toml(text: str) -> dict[str, Any]:
    """TOML text as ``tomllib`` reads it, or :class:`TomlError`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlError(f"not valid TOML: {exc}") from None
    except RecursionError:
        # tomllib nests a call per inline table or array: a few hundred levels exhaust the
        # interpreter's stack.
        raise TomlError("tables or arrays nest too deeply to be read") from None
    except ValueError as exc:
        # Python's own limit let through by tomllib: int() refuses thousands of digits (a
        # guard against quadratic conversion); its advice to raise the limit is cut.
        raise TomlError(f"a value cannot be read: {str(exc).split(';')[0]}") from None


def read_toml(path: str | os.PathLike[str], max_bytes: int = MAX_TOML_BYTES
              ) -> dict[str, Any]:
    """The TOML file at ``path``: OSError where it cannot be read (each caller says a
    missing file in its own words), :class:`TomlError` for one larger than ``max_bytes``,
    not UTF-8, or not TOML labd can read."""
    with open(path, "rb") as handle:
        raw = handle.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise TomlError(f"too large (over {max_bytes:,} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TomlError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads_toml(text)
