"""What every command-line entry of labd shares (the labd command, and the agent's own entry,
which loads nothing else of the daemon): the consoles, a user's mistake as one message and
an exit code, and a service run until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Awaitable, Callable

import typer
from rich.console import Console
from rich.markup import escape

from labd.errors import LabdError
from labd.runtime import run

# Reports are wide tables: when the output is a file or a CI log, do not squeeze them to 80.
console = Console(width=None if sys.stdout.isatty() else 132)
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as an error; the caller raises what this returns."""
    # escape: messages quote lab-file sections like [[instrument]], which are not markup
    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def run_until_signalled(what: str, body: Callable[[asyncio.Event], Awaitable[None]], *,
                        spawns: bool = False) -> None:
    """Run a long-lived service until SIGINT or SIGTERM, then let it shut down cleanly;
    a start-up failure is one clear message."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        # Not loop.add_signal_handler: asyncio's own loop hears of the signal through its
        # self-pipe, and a loop flooded with thread-safe callbacks (thousands of MQTT
        # clients, each waking it) fills that pipe; the signal is then lost ("Exception
        # ignored when trying to write to the signal wakeup fd") and the process never
        # stops. Python's handler runs regardless; the callback it queues waits in the
        # loop's ready queue even when the pipe is full.
        def on_signal(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(stop.set)

        previous = {sig: signal.signal(sig, on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            await body(stop)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    try:
        run(main(), spawns=spawns)
    except OSError as exc:
        raise fail(f"cannot start {what}: {exc}") from None
    except LabdError as exc:
        raise fail(str(exc)) from None
    finally:
        # The service is over and the process exits next. Its interpreter would first walk
        # every object the daemon's libraries made (SQLAlchemy, Alembic, pydantic models)
        # looking for cycles, half a second of a stop that systemd times; kept out of the
        # final collections, they are freed all the same.
        gc.freeze()
