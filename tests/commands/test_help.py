"""Every command's --help reads as paragraphs, and shell completion is on."""

from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from labd.commands.main import app, paragraphs


def commands(command: Any, path: str = "labd") -> Iterator[tuple[str, Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, f"{path} {name}")


def test_docstrings_become_whole_paragraphs() -> None:
    assert paragraphs("One sentence broken\n    over two lines.\n\n    A second one.") == \
        "One sentence broken over two lines.\n\nA second one."
    example = "Like this:\n\n        labd run demo\n        labd tui\n\n    Then more."
    assert paragraphs(example) == ("Like this:\n\n\b\n    labd run demo\n    labd tui"
                                   "\n\nThen more.")


def test_every_help_text_is_made_of_paragraphs() -> None:
    found = dict(commands(typer.main.get_command(app)))
    assert {"labd run", "labd config show", "labd measure failover", "labd agent"} <= \
        set(found)
    for path, command in found.items():
        for paragraph in (command.help or "").split("\n\n"):
            # A line break inside a paragraph is a sentence broken mid-way, unless the
            # paragraph says it keeps its lines (an example).
            assert paragraph.startswith("\b") or "\n" not in paragraph, (path, paragraph)


def test_help_pages_and_completion() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert top.exit_code == 0 and "--install-completion" in top.output
    for path, _ in commands(typer.main.get_command(app)):
        result = runner.invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0, (path, result.output)
    run = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "120"}).output
    for option in ("--config", "--log-level", "--log-format", "--log-file",
                   "--watch-interval"):
        assert option in run
