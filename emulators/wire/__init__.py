"""The wire side every emulator shares: the TCP/pty server, SCPI and TL1 framing, and the
faults a test can inject into a session (drop, silence, garbage, delay)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["faults", "numbers", "scpi", "server", "tl1"]
