"""A few fields typed in turn, for a change that needs them (docs/tui.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label

from tui.screens.frame import dialog


class FormScreen(ModalScreen[dict[str, str] | None]):
    """A few fields typed in turn: Enter moves to the next and, in the last, submits;
    Escape cancels. Answers each field's value by its id."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, fields: list[tuple[str, str, str]], *,
                 choices: dict[str, Sequence[str]] | None = None) -> None:
        """``fields``: (id, label, initial value), the label shown above the field (a
        placeholder alone goes once the field holds a value); ``choices``: what a field's
        value may be, by its id, offered as it is typed (→ or End takes the offer)."""
        super().__init__()
        self.title_text = title
        self.fields = fields
        self.choices = choices or {}

    def compose(self) -> ComposeResult:
        with dialog():
            yield Label(f"{self.title_text} (Enter: next field, then go; Esc cancels)",
                        markup=False)
            for field_id, label, value in self.fields:
                known = self.choices.get(field_id)
                yield Label(label, id=f"{field_id}-label", classes="field-label",
                            markup=False)
                yield Input(value=value, id=field_id,
                            suggester=SuggestFromList(known, case_sensitive=False)
                            if known else None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        ids = [f[0] for f in self.fields]
        at = ids.index(str(event.input.id))
        if at + 1 < len(ids):
            self.query_one(f"#{ids[at + 1]}", Input).focus()
            return
        values = {i: self.query_one(f"#{i}", Input).value.strip() for i in ids}
        if all(values.values()):
            self.dismiss(values)
        else:
            self.notify("every field is needed", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)
