"""The ``labd`` command: the Typer app, its options (version, verbosity) and every command
registered on it. Each command lives in a module of its own and loads what it needs only
when it runs, so ``labd --help`` and ``labd agent`` stay light. Every subcommand reports
user mistakes as one clear message and a non-zero exit code, never as a traceback
(``labd.commands.common.fail``)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from labd import __version__
from labd.agent.cli import agent
from labd.commands import measure
from labd.commands.broker import broker_config
from labd.commands.check import check
from labd.commands.common import console
from labd.commands.demo import demo
from labd.commands.emulate import emulate
from labd.commands.probe import probe_command
from labd.commands.run import run_daemon
from labd.commands.tui import tui

app = typer.Typer(
    name="labd",
    help="Control daemon for photonic ML-fabric testbeds: optical circuit switches, "
         "power meters, photonic meshes and GPU hosts, with faithful emulators.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def _version(value: bool) -> None:
    if value:
        console.print(f"labd {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True,
                                         help="-v for info, -vv for debug (raw bytes).")] = 0,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _setup_logging(verbose)


# In this order in `labd --help`.
app.command()(demo)
app.command("run")(run_daemon)
app.command()(tui)
app.command()(agent)
app.command()(emulate)
app.command("probe")(probe_command)
app.command("check")(check)
app.command("broker-config")(broker_config)
app.add_typer(measure.app, name="measure")


def main() -> None:
    app()
