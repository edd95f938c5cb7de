"""The lab file (``labd.lab.file``: every field, checked with the entry named) and the
questions its cabling answers (``labd.lab.wiring``)."""
