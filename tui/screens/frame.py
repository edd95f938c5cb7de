"""The frame every dialog shares: as wide as its text up to a readable bound or the screen,
and scrolled where it is taller than the screen (app.tcss, ``.dialog-frame``, ``#dialog``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from textual.containers import Vertical, VerticalScroll


class DialogBody(VerticalScroll, can_focus=False):
    """A dialog's body: scrolled by the mouse where it overflows, never focused, so that
    the keys go to the dialog's first field (or to the dialog's own bindings)."""


@contextlib.contextmanager
def dialog() -> Iterator[None]:
    """Compose a dialog's widgets inside this block."""
    with Vertical(classes="dialog-frame"), DialogBody(id="dialog"):
        yield
