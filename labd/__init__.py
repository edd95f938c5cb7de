"""labd: the control daemon for photonic ML-fabric testbeds."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("labd")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

# Its parts, each imported where it is used: importing labd loads none of them.
__all__ = [
    "__version__",
    "agent", "client", "commands", "daemon", "deadlines", "emulation", "errors", "events",
    "fabric", "files", "ha", "hosts", "hostwire", "lab", "logs", "measure", "mqtt", "repeats",
    "runtime", "settings", "store", "systemd", "terminal", "testing", "token", "vocabulary"
]
