"""Instrument addresses: ``tcp://host:port``, ``serial:///dev/ttyUSB0?baud=115200``, ``visa://RESOURCE``.

``usbtmc:///dev/usbtmc0`` reaches a USB test-and-measurement device through the kernel's
driver (:mod:`instruments.transports.usbtmc`).

``memory://NAME`` reaches a device played in the same process
(:mod:`instruments.transports.memory`).

Serial options (query string): ``baud`` (default 9600), ``bytesize`` (5-8), ``parity``
(N, E, O, M, S), ``stopbits`` (1, 1.5, 2), ``rtscts`` and ``xonxoff`` (0/1).
A VISA address carries the resource string unchanged: ``visa://TCPIP::10.0.0.5::5025::SOCKET``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from instruments.errors import AddressError

SERIAL_OPTIONS = {"baud", "bytesize", "parity", "stopbits", "rtscts", "xonxoff"}


@dataclass(frozen=True)
class Address:
    """A parsed instrument address. ``target`` is host, device path or VISA resource."""

    scheme: str
    target: str
    port: int | None = None
    options: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.scheme == "tcp":
            return f"tcp://{self.target}:{self.port}"
        if self.scheme == "serial":
            query = "&".join(f"{k}={v}" for k, v in self.options.items())
            return f"serial://{self.target}" + (f"?{query}" if query else "")
        return f"{self.scheme}://{self.target}"


def parse_address(text: str) -> Address:
    """Parse an address string; raise :class:`AddressError` naming what is wrong."""
    if "://" not in text:
        raise AddressError(
            f"address {text!r} has no scheme; expected tcp://HOST:PORT, "
            "serial:///dev/PATH?baud=N, visa://RESOURCE or usbtmc:///dev/usbtmcN"
        )
    scheme, rest = text.split("://", 1)
    scheme = scheme.lower()
    if scheme in ("visa", "memory"):
        if not rest:
            what = "VISA resource" if scheme == "visa" else "device name"
            raise AddressError(f"address {text!r}: missing {what} after {scheme}://")
        return Address(scheme, rest)
    if scheme == "tcp":
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            raise AddressError(f"address {text!r}: port must be a number 0-65535") from None
        if not parts.hostname or port is None:
            raise AddressError(f"address {text!r}: expected tcp://HOST:PORT")
        return Address("tcp", parts.hostname, port)
    if scheme == "serial":
        path, _, query = rest.partition("?")
        if not path.startswith("/"):
            raise AddressError(
                f"address {text!r}: expected an absolute device path, e.g. serial:///dev/ttyUSB0"
            )
        options = dict(parse_qsl(query, keep_blank_values=True))
        unknown = set(options) - SERIAL_OPTIONS
        if unknown:
            raise AddressError(
                f"address {text!r}: unknown serial option(s) {sorted(unknown)}; "
                f"known: {sorted(SERIAL_OPTIONS)}"
            )
        if "baud" in options and not options["baud"].isdigit():
            raise AddressError(f"address {text!r}: baud must be a whole number")
        return Address("serial", path, None, options)
    if scheme == "usbtmc":
        if not rest.startswith("/") or "?" in rest:
            raise AddressError(f"address {text!r}: expected the device's absolute path, e.g. "
                               "usbtmc:///dev/usbtmc0")
        return Address("usbtmc", rest)
    raise AddressError(f"address {text!r}: unknown scheme {scheme!r}; expected tcp, serial, "
                       "visa, usbtmc or memory")
