"""The daemon's bearer token: ``--token``, else ``$LABD_TOKEN``, else a file in the user's
state folder (``$XDG_STATE_HOME/labd/token``), made on first use with mode 0600. The daemon
requires it for every change; the CLI, the TUI and HTTP agents find it the same way."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def token_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "labd" / "token"


def find_token(explicit: str | None) -> str | None:
    """--token, else $LABD_TOKEN, else the token file if there is one."""
    if explicit or os.environ.get("LABD_TOKEN"):
        return explicit or os.environ["LABD_TOKEN"]
    path = token_path()
    return path.read_text().strip() if path.exists() else None


def load_or_make_token(explicit: str | None) -> str:
    """--token, else $LABD_TOKEN, else the token file (made on first use, mode 0600)."""
    found = find_token(explicit)
    if found:
        return found
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token
