"""The lab file (``labd.lab.loader``: every field, checked with the entry named) and the
questions its cabling answers (``labd.lab.wiring``)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["entries", "limits", "loader", "model", "options", "wiring"]
