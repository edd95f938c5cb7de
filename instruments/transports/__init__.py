"""Async byte transports: one small contract, five implementations.

Every transport opens, writes bytes, reads up to a separator or an exact count, and closes.
Timeouts are not the transport's business: :class:`instruments.link.Link` bounds every read.
Each implementation maps its library's errors to ``instruments.errors`` and nothing else.
"""

from __future__ import annotations

from instruments.address import Address, parse_address
from instruments.errors import AddressError
from instruments.transports.base import Transport


def make_transport(address: str | Address, *, timeout: float = 2.0) -> Transport:
    """The transport for an address (not yet open)."""
    addr = parse_address(address) if isinstance(address, str) else address
    if addr.scheme == "tcp":
        from instruments.transports.tcp import TcpTransport

        return TcpTransport(addr)
    if addr.scheme == "serial":
        from instruments.transports.serial import SerialTransport

        return SerialTransport(addr)
    if addr.scheme == "visa":
        from instruments.transports.visa import VisaTransport

        return VisaTransport(addr, timeout=timeout)
    if addr.scheme == "usbtmc":
        from instruments.transports.usbtmc import UsbtmcTransport

        return UsbtmcTransport(addr, timeout=timeout)
    if addr.scheme == "memory":
        from instruments.transports.memory import MemoryTransport

        return MemoryTransport(addr)
    raise AddressError(f"no transport for scheme {addr.scheme!r}")


__all__ = ["Transport", "make_transport"]
