"""The ``labd`` command: the Typer app, its options (version, verbosity) and every command
registered on it. Each command lives in a module of its own and loads what it needs only
when it runs, so ``labd --help`` and ``labd agent`` stay light. Every subcommand reports
user mistakes as one clear message and a non-zero exit code, never as a traceback
(``labd.commands.common.fail``)."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer
import typer.main

from labd import __version__
from labd.agent.cli import agent
from labd.commands import config, measure
from labd.commands.broker import broker_config
from labd.commands.check import check
from labd.commands.common import console
from labd.commands.demo import demo
from labd.commands.discover import discover
from labd.commands.emulate import emulate
from labd.commands.fleet import fleet
from labd.commands.health import health
from labd.commands.probe import probe_command
from labd.commands.run import run_daemon
from labd.commands.tui import tui
from labd.logs import configure, level_for

app = typer.Typer(
    name="labd",
    help="Control daemon for photonic ML-fabric testbeds: optical circuit switches, "
         "power meters, photonic meshes and GPU hosts, with faithful emulators.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        console.print(f"labd {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True,
                                         help="-v for info, -vv for debug (raw bytes).")] = 0,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    # Commands with log options of their own (labd run, labd agent) set them up again.
    ctx.obj = {"verbose": verbose}
    configure(level_for(verbose, None))


def paragraphs(text: str | None) -> str | None:
    """A docstring as help: each paragraph one line (the terminal wraps it), a paragraph
    whose lines are indented (an example) kept as it is."""
    if not text:
        return text
    out = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.splitlines()
        if paragraph.startswith("\b") or any(line.startswith(" ") for line in lines):
            out.append(paragraph if paragraph.startswith("\b") else "\b\n" + paragraph)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def _reflow(group: typer.Typer) -> None:
    """Every command's help as paragraphs: click keeps a docstring's line breaks in the
    command lists and in every paragraph after the first."""
    for command in group.registered_commands:
        command.help = paragraphs(command.help or inspect.getdoc(command.callback))
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            info = sub.typer_instance.info
            info.help = paragraphs(sub.help or info.help)
            _reflow(sub.typer_instance)


# In this order in `labd --help`.
app.command()(demo)
app.command("run")(run_daemon)
app.command()(tui)
app.command()(agent)
app.command()(emulate)
app.command("probe")(probe_command)
app.command("check")(check)
app.command("health")(health)
app.command()(discover)
app.command("broker-config")(broker_config)
app.command("fleet")(fleet)
app.add_typer(config.app, name="config")
app.add_typer(measure.app, name="measure")
_reflow(app)


def main() -> None:
    from labd.commands.complete import attach

    # Built here, not by app(), so that values complete too (labd.commands.complete).
    attach(typer.main.get_command(app))()
