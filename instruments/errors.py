"""The one exception tree of the instrument layer.

Lower-layer errors (``OSError``, ``serial.SerialException``, ``pyvisa`` errors,
``asyncio.TimeoutError``) are mapped into it in exactly one place, the transports and
:class:`instruments.link.Link`; nothing above them sees a foreign exception.

    InstrumentError                 anything that went wrong talking to an instrument
    ├── AddressError                the address string cannot be used (bad scheme, port, option)
    ├── ConnectError                the link could not be opened (refused, no such port)
    ├── InstrumentTimeout           no complete reply within the instrument's timeout
    ├── InstrumentClosed            the link was closed, by us or by the device, or is offline
    │   └── DeviceRestarted         the device answers, but as a device that has restarted
    ├── ProtocolError               the reply does not parse as the protocol says it must
    ├── DeviceError                 the device refused the command (SCPI error queue, TL1 DENY)
    │   └── AuthenticationError     the device refused the login or says we are not logged in
    ├── NotSupported                the device (or this model of it) has no such capability
    └── InvalidRequest              the request itself is wrong (a pair on one side, a port twice)
        └── NoSuchPort              it names a port or channel the device does not have
"""

from __future__ import annotations


class InstrumentError(Exception):
    """Base class: every error raised by ``instruments`` derives from it."""

    def __init__(self, message: str, *, instrument: str | None = None) -> None:
        self.message = message
        self.instrument = instrument
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.instrument}: {self.message}" if self.instrument else self.message


class AddressError(InstrumentError):
    """The address cannot be used; the message says which part and what is expected."""


class ConnectError(InstrumentError):
    """Opening the link failed. Check the address, cabling and that the device is powered."""


class InstrumentTimeout(InstrumentError):
    """No complete reply in time. Often a termination mismatch: see ``labd probe``."""


class InstrumentClosed(InstrumentError):
    """The link is closed (by the device, by a fault, or because we closed it)."""


class DeviceRestarted(InstrumentClosed):
    """The device restarted behind an open link (its identity changed, or it says it
    powered up): the link is dropped and made again, so that the state is read anew."""


class ProtocolError(InstrumentError):
    """A reply did not parse. The message quotes the reply."""


class DeviceError(InstrumentError):
    """The device refused a command and said why.

    ``code`` is the device's own code: an SCPI error number (e.g. ``-222``) or a TL1 DENY
    code (e.g. ``"IIAC"``); ``text`` is its message.
    """

    def __init__(
        self, code: int | str, text: str, *, command: str | None = None,
        instrument: str | None = None,
    ) -> None:
        self.code = code
        self.text = text
        self.command = command
        where = f" (to {command!r})" if command else ""
        super().__init__(f"device refused{where}: {code} {text}".rstrip(), instrument=instrument)


class AuthenticationError(DeviceError):
    """Login refused or missing. Check the credentials in the lab file."""


class NotSupported(InstrumentError):
    """The device has no such capability (e.g. port power on an I-OST Polatis)."""


class InvalidRequest(InstrumentError):
    """The request cannot be valid for this device (port out of range, a port used twice)."""


class NoSuchPort(InvalidRequest):
    """The request names a port (or channel) the device does not have; the message gives
    the device's range."""
