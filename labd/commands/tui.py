"""``labd tui``: the terminal UI on a running daemon. The one command that imports the
``tui`` package, and only when it runs (docs/architecture.md)."""

from __future__ import annotations

from typing import Annotated

import typer


def tui(
    url: Annotated[str, typer.Argument(help="The daemon's URL.")] = "http://127.0.0.1:8470",
    token: Annotated[str | None, typer.Option(
        help="Token for changes (default: $LABD_TOKEN, else the token file).")] = None,
) -> None:
    """The terminal UI: port maps, hosts, the latest failover, reconfigurations and events
    of a running daemon, live; keys in the footer."""
    from labd.token import find_token
    from tui.app import LabApp

    LabApp(url, find_token(token)).run()
