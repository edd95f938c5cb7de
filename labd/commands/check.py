"""``labd check``: validate a lab file and list its instruments."""

from __future__ import annotations

from typing import Annotated

import typer

from labd.commands.common import console, load


def check(lab: Annotated[str, typer.Argument(help="Lab file path or packaged name.")]) -> None:
    """Validate a lab file and list its instruments."""
    loaded = load(lab)
    console.print(f"{loaded.source}: lab [cyan]{loaded.lab.name}[/], "
                  f"{len(loaded.instrument)} instrument(s)")
    for entry in loaded.instrument:
        where = "emulated" if entry.emulate else entry.address
        console.print(f"  {entry.id:12} {entry.driver:14} {where}")
