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

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with dialog():
            yield Label(self.question, id="question", markup=False)
            yield Label("y / Enter: yes    n / Esc: no", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
