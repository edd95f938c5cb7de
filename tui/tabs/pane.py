"""What every tab has: its help, the widget that takes its keys, and a picture that is
drawn only while the tab is in view."""

from __future__ import annotations

from typing import ClassVar

from textual.widgets import TabbedContent, TabPane


class Pane(TabPane):
    """A tab of the app. One whose picture changes while out of sight draws it when next
    shown: drawing a table nobody sees costs a full repaint of the screen."""

    HELP: ClassVar[str] = ""
    """What the tab shows and which keys act on it (``?``)."""
    KEYS_AT: ClassVar[str] = ""
    """The widget that takes the keys while the tab is in view."""

    def __init__(self, title: str, tab: str) -> None:
        super().__init__(title, id=tab)
        self.out_of_date = False
        """Changed while out of sight: drawn when next shown."""

    def live(self) -> bool:
        """The app is not closing. Once it is, its widgets go one by one while the event
        stream may still deliver: a tab that is still attached can have lost its children."""
        return self.app.is_running and self.is_attached

    def in_view(self) -> bool:
        """The tab is the one shown (and the app is not closing)."""
        return self.live() and self.query_ancestor(TabbedContent).active == self.id

    def changed(self) -> None:
        """Draw now if the tab is in view, else when it is next shown."""
        if self.in_view():
            self.draw()
        else:
            self.out_of_date = True

    def came_into_view(self) -> None:
        if self.out_of_date:
            self.out_of_date = False
            self.draw()

    def draw(self) -> None:
        """Draw the whole picture from what the tab keeps."""

    def take_keys(self) -> None:
        self.query_one(self.KEYS_AT).focus()
