"""The daemon's bearer token (its admin key): a token file named (``--token-file``), else
``$LABD_TOKEN``, else the token file in the user's state folder
(``$XDG_STATE_HOME/labd/token``), made on first use with mode 0600 from the start. Never a
command-line value: argv is for every user of the machine to read (``ps``). The CLI, the TUI
and HTTP agents find it the same way."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from labd.errors import AccessError
from labd.files import create_private


def token_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "labd" / "token"


def read_token_file(path: str | Path) -> str:
    """The token a file holds (its first line); AccessError if it cannot be read or is
    empty."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessError(f"token file {path}: {exc or type(exc).__name__}") from None
    if not token or "\n" in token:
        raise AccessError(f"token file {path} must hold the token alone, on one line")
    return token


def find_token(explicit: str | None = None, *, file: str | Path | None = None
               ) -> str | None:
    """``explicit`` (given in code, never from argv), else the token in ``file`` (one the
    user named: it wins over the environment, as in ``labd run``), else $LABD_TOKEN, else
    the token file if there is one."""
    if explicit:
        return explicit
    if file is not None:
        return read_token_file(file)
    if os.environ.get("LABD_TOKEN"):
        return os.environ["LABD_TOKEN"]
    path = token_path()
    return read_token_file(path) if path.exists() else None


def load_or_make_token(explicit: str | None = None, *, file: str | Path | None = None
                       ) -> str:
    """As :func:`find_token`; without any, the token file, made now (mode 0600)."""
    found = find_token(explicit, file=file)
    if found:
        return found
    return make_token_file(token_path())


def make_token_file(path: Path) -> str:
    """A new token in a new file, readable by its owner alone from its first byte (created
    0600, never widened then narrowed); if another process made it meanwhile, its token."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(24)
    if not create_private(path, token + "\n"):
        return read_token_file(path)
    return token
