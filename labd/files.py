"""Files for their owner's eyes alone (tokens, keys, the store): created with mode 0600 from
their first byte, never made with the default mode and narrowed after (another user could
open the file in between and keep it open); and the check that says whether others can
read one that is already there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

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
