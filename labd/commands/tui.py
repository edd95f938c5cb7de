"""``labd tui``: the terminal UI on a running daemon. The one command that imports the
``tui`` package, and only when it runs (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def tui(
    url: Annotated[str, typer.Argument(help="The daemon's URL.")] = "http://127.0.0.1:8470",
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the key the UI reads and changes with (default: $LABD_TOKEN, "
             "else the daemon's token file).")] = None,
    ca: Annotated[Path | None, typer.Option(
        help="For an https:// daemon: the certificate (or its CA) to trust.")] = None,
) -> None:
    """The terminal UI: port maps, hosts, the latest failover, reconfigurations and events
    of a running daemon, live; keys in the footer."""
    from labd.commands.common import fail
    from labd.errors import LabdError
    from labd.token import find_token
    from tui.app import LabApp

    try:
        token = find_token(file=token_file)
    except LabdError as exc:
        raise fail(str(exc)) from None
    LabApp(url, token, ca=str(ca) if ca else None).run()
