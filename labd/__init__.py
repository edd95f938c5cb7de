"""labd: the control daemon for photonic ML-fabric testbeds."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("labd")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"
