"""The client side: the daemon's HTTP API (``labd.client.api``, what the TUI and scripts use)
and the emulators' control endpoint (``labd.client.control``). Nothing here loads the
daemon, the store or a driver."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["api", "control"]
