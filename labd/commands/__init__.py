"""The ``labd`` command: ``labd.commands.main`` holds the Typer app; each command group
lives in a module of its own and loads what it needs only when it runs."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "broker", "check", "common", "config", "demo", "emulate", "main", "measure", "probe", "run",
    "tui",
]
