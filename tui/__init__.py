"""The terminal UI on a running daemon (``labd tui``), a client of its API alone."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["app", "changes", "matrix", "render", "screens", "sentences", "tabs"]
