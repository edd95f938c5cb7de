"""``labd config show``: the settings ``labd run`` would run with, and where each came from
(default, file, env, flag), passwords masked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from labd.commands.common import console, fail

app = typer.Typer(help="The daemon's settings.", no_args_is_help=True)


@app.command("show")
def show(
    lab: Annotated[str | None, typer.Argument(
        help="A lab file (path or packaged name) whose \\[daemon] table counts too.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="The settings file labd run is given (--config).")] = None,
    db: Annotated[str | None, typer.Option(help="As labd run --db.")] = None,
    host: Annotated[str | None, typer.Option(help="As labd run --host.")] = None,
    port: Annotated[int | None, typer.Option(help="As labd run --port.")] = None,
    mqtt: Annotated[str | None, typer.Option(help="As labd run --mqtt.")] = None,
    log_level: Annotated[str | None, typer.Option(help="As labd run --log-level.")] = None,
    log_format: Annotated[str | None, typer.Option(help="As labd run --log-format.")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object: each setting's value and source.")] = False,
) -> None:
    """Print the settings labd run would run with: each one's value and where it came from
    (default, file, env or flag), passwords in URLs masked.

    Give the same lab, --config and options as to labd run; the LABD_* environment
    variables are read from this shell. The token is never shown: only whether
    $LABD_TOKEN holds one."""
    from labd.commands.run import effective_settings
    from labd.settings import NAMES, SettingsError

    flags: dict[str, Any] = {"db": db, "host": host, "port": port, "mqtt": mqtt,
                             "log_level": log_level, "log_format": log_format}
    try:
        resolved = effective_settings(lab, config, flags)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    token = "set (masked)" if os.environ.get("LABD_TOKEN") else "(none)"
    if as_json:
        out: dict[str, dict[str, str | None]] = {
            name: {"value": resolved.shown(name), "source": resolved.source(name),
                   "from": resolved.where[name]} for name in NAMES}
        out["token"] = {"value": "***" if os.environ.get("LABD_TOKEN") else None,
                        "source": "env" if os.environ.get("LABD_TOKEN") else "default",
                        "from": "env LABD_TOKEN" if os.environ.get("LABD_TOKEN") else "default"}
        console.print_json(json.dumps(out))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table("setting", "value", "source", "from", box=None, pad_edge=False)
    for name in NAMES:
        source = resolved.source(name)
        style = "dim" if source == "default" else "bold"
        table.add_row(name, escape(resolved.shown(name)), f"[{style}]{source}[/]",
                      "" if source == "default" else escape(resolved.where[name].split(" ", 1)[1]))
    table.add_row("token", token, "env" if os.environ.get("LABD_TOKEN") else "default",
                  "LABD_TOKEN (never a setting)")
    console.print(table)
