"""Instrument drivers: async transports, SCPI/TL1 framing, one module per device family.

Nothing here imports ``labd``, ``emulators`` or ``tui``: the drivers are usable on their own::

    from instruments import open_switch
    async with open_switch("polatis-scpi", "tcp://10.0.0.20:5025") as ocs:
        await ocs.connect([(1, 17), (2, 18)])
"""

from instruments.errors import (
    ConnectError,
    DeviceError,
    InstrumentClosed,
    InstrumentError,
    InstrumentTimeout,
    NotSupported,
    ProtocolError,
)
from instruments.registry import SWITCH_DRIVERS, open_switch

__all__ = [
    "SWITCH_DRIVERS",
    "ConnectError",
    "DeviceError",
    "InstrumentClosed",
    "InstrumentError",
    "InstrumentTimeout",
    "NotSupported",
    "ProtocolError",
    "open_switch",
]
