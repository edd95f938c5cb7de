"""What the commands share: what every command-line entry of labd does (labd.terminal: the
consoles, a user's mistake as one message and an exit code, a service run until it is told
to stop), and loading a lab file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from labd.errors import LabFileError
from labd.terminal import console, err_console, fail, run_until_signalled

if TYPE_CHECKING:
    from labd.lab.loader import Lab


def load(lab: str) -> Lab:
    """A lab file (path or packaged name); its problems are one message, exit code 2."""
    # Here, not at the top: the lab file loads the drivers, which --help does not need.
    from labd.lab.loader import load_lab

    try:
        return load_lab(lab)
    except LabFileError as exc:
        raise fail("the lab file has problems:\n  " + "\n  ".join(exc.problems)) from None


__all__ = ["console", "err_console", "fail", "load", "run_until_signalled"]
