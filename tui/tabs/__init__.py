"""The app's tabs, one module each: a pane that keeps what it shows and draws it."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["events", "failover", "hosts", "matrix", "pane", "ports", "reconfigurations"]
