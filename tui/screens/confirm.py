"""The question every change asks first (docs/tui.md)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Label

from tui.screens.frame import dialog


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question before a change: y or Enter says yes, n or Escape no."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str, detail: str = "") -> None:
        """``detail``: what the change would do, shown under the question (a circuit's
        planned switches and ports)."""
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with dialog():
            yield Label(self.question, id="question", markup=False)
            if self.detail:
                yield Label(self.detail, id="detail", markup=False)
            yield Label("y / Enter: yes    n / Esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
