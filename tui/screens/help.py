"""Help for the tab in view, and the keys that work everywhere."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Label

from tui.screens.frame import dialog

KEYS = ("Everywhere: 1-6 tabs (Ports, Hosts, Failover, Reconfigurations, Events, Matrix) · "
        "/ filter · c circuit · p raw pair · x break · m measure · d drill · r resync · "
        "? this help · ctrl+p command palette · q quit. Every change asks first; a key "
        "dimmed in the footer cannot work in this lab and says why. When the daemon is "
        "unreachable a banner says so and the last picture is kept. Esc closes this help.")


class HelpScreen(ModalScreen[None]):
    """Help for the tab in view; any of Escape, ? or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"), Binding("question_mark", "close", "Close"),
        Binding("q", "close", "Close")]

    def __init__(self, text: str, off: list[str] | None = None) -> None:
        """``text``: what the tab in view shows and which keys act on it; ``off``: the
        keys that cannot work here, each with why."""
        super().__init__()
        self.text = text
        self.off = off or []

    def compose(self) -> ComposeResult:
        with dialog():
            yield Label(self.text, id="help-tab", markup=False)
            yield Label(KEYS, id="help-keys", markup=False)
            if self.off:
                yield Label("Off here: " + " · ".join(self.off), id="help-off",
                            markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
