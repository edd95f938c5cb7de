"""Driver names, as written in a lab file's ``driver`` field, and a one-line way to open one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from instruments.calient import CalientTl1
from instruments.errors import InvalidRequest
from instruments.mesh import MeshSwitch
from instruments.polatis_scpi import PolatisScpi
from instruments.polatis_tl1 import PolatisTl1
from instruments.switch import OpticalSwitch

SWITCH_DRIVERS: dict[str, type[OpticalSwitch]] = {
    cls.driver: cls for cls in (PolatisScpi, PolatisTl1, CalientTl1, MeshSwitch)
}


def switch_driver(name: str) -> type[OpticalSwitch]:
    try:
        return SWITCH_DRIVERS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown switch driver {name!r}; known: {', '.join(sorted(SWITCH_DRIVERS))}"
        ) from None


@asynccontextmanager
async def open_switch(driver: str, address: str, **options: Any) -> AsyncIterator[OpticalSwitch]:
    """``async with open_switch("polatis-scpi", "tcp://host:5025") as ocs: ...``"""
    switch = switch_driver(driver)(address, **options)
    await switch.open()
    try:
        yield switch
    finally:
        await switch.close()
