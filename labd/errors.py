"""labd's own errors (the instrument layer has its tree in ``instruments.errors``)."""

from __future__ import annotations


class LabdError(Exception):
    """Base of errors labd reports to the user as a message, never as a traceback."""


class LabFileError(LabdError):
    """The lab file cannot be used. ``problems`` holds one line per mistake, each naming
    the file, the entry and the field."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(problems))
