"""The ``labd`` command: ``labd.commands.main`` holds the Typer app; each command group
lives in a module of its own and loads what it needs only when it runs."""
