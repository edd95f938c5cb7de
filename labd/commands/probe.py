"""``labd probe``: a raw session with one instrument, showing bytes and timing.

For the engineer chasing a termination or timeout problem: each line typed (or given with
``-c``) is sent with the chosen write termination; the reply is read up to the read
termination (or, with ``--tl1``, up to the ``;`` line that ends a TL1 block) and shown with
its round-trip time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from labd.commands.common import console as stdout_console
from labd.commands.common import fail
from labd.runtime import run


def unescape(text: str) -> str:
    """``\\r\\n`` as typed on a command line → CR LF."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def probe_command(
    address: Annotated[str, typer.Argument(help="tcp://HOST:PORT, serial:///dev/X?baud=N or "
                                                "visa://RESOURCE")],
    command: Annotated[list[str] | None, typer.Option("--command", "-c",
                                                      help="Send this and exit "
                                                           "(repeatable).")] = None,
    write_term: Annotated[str, typer.Option(help="Write termination (escapes allowed).")]
    = "\\n",
    read_term: Annotated[str, typer.Option(help="Read termination (escapes allowed).")]
    = "\\n",
    timeout: Annotated[float, typer.Option(min=0.001, help="Reply timeout, seconds.")] = 2.0,
    tl1: Annotated[bool, typer.Option("--tl1", help="Read whole TL1 blocks (up to the ';' "
                                                    "line).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Show replies as Python bytes.")] = False,
) -> None:
    """A raw session with one instrument: send lines, see replies and their timing."""
    from instruments.address import parse_address
    from instruments.errors import AddressError

    try:
        parse_address(address)
    except AddressError as exc:
        raise fail(str(exc)) from None
    try:
        code = run(probe(address, commands=command or [], write_term=unescape(write_term),
                         read_term=unescape(read_term), timeout=timeout, tl1=tl1, raw=raw,
                         console=stdout_console))
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


async def probe(address: str, *, commands: list[str], write_term: str, read_term: str,
                timeout: float, tl1: bool, raw: bool, console: Console) -> int:
    # Here, not at the top: the drivers are loaded only when a probe runs.
    from instruments.errors import InstrumentError, InstrumentTimeout
    from instruments.link import Link, LinkSettings

    link = Link(address, LinkSettings(write_termination=write_term, read_termination=read_term,
                                      timeout=timeout), name=address)
    try:
        started = time.perf_counter()
        await link.open()
    except InstrumentError as exc:
        console.print(f"[red]cannot open {escape(address)}:[/] {escape(str(exc))}")
        return 2
    console.print(f"connected to {escape(address)} in "
                  f"{(time.perf_counter() - started) * 1e3:.2f} ms "
                  f"(write {write_term!r}, read {read_term!r}, timeout {timeout:g} s)")
    separator = b"\n;" if tl1 else read_term.encode()
    interactive = not commands and sys.stdin.isatty()
    failures = 0
    try:
        async for line in _lines(commands, interactive):
            if not line.strip():
                continue
            start = time.perf_counter()
            await link.write(line)
            try:
                reply = await link.read_until(separator)
            except InstrumentTimeout:
                console.print(f"[yellow]no reply within {timeout:g} s[/] "
                              f"(query without a reply, or a termination mismatch?)")
                stale = link.discard_input()
                if stale:
                    console.print(f"  partial bytes: {stale!r}")
                continue
            except InstrumentError as exc:
                console.print(f"[red]{escape(str(exc))}[/]")
                failures += 1
                break
            ms = (time.perf_counter() - start) * 1e3
            shown = repr(reply) if raw else reply.decode("latin-1").rstrip()
            console.print(f"[dim]{ms:8.3f} ms[/] {escape(shown)}")
    finally:
        await link.close()
    return 1 if failures else 0


async def _lines(commands: list[str], interactive: bool) -> AsyncIterator[str]:
    if commands:
        for command in commands:
            yield command
        return
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        yield line.rstrip("\r\n")
