"""An emulated bench for the framework adapters, served from a thread of its own: the
frameworks under test block the test's thread (a RunEngine, QCoDeS, the blocking facade),
so the emulators cannot share its loop. Drivers and emulators meet over real sockets and a
real pty, as anywhere else."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from emulators.lab import EmulatedLab, EmulatorSpec, OpticsSpec, ServeSpec
from emulators.physics.optics import EndpointSpec, FiberSpec

T = TypeVar("T")

#: What the bench launches (dBm) and loses (dB), the numbers every expected reading is made of.
LAUNCH = {"laser0": 0.0, "laser1": -3.0}
INTO_SWITCH_DB = 0.5
SWITCH_DB = 1.2
INTO_MESH_DB = 0.2
INTO_METER_DB = 0.3
#: An unlit port: the optical model's floor is -90 dBm; anything lit here is above -10.
DARK_BELOW_DBM = -60.0

WIRING = OpticsSpec(
    [EndpointSpec("laser0", LAUNCH["laser0"]), EndpointSpec("laser1", LAUNCH["laser1"])],
    [FiberSpec("laser0", "ocs1:1", INTO_SWITCH_DB),
     FiberSpec("laser1", "ocs1:2", INTO_SWITCH_DB),
     FiberSpec("ocs1:17", "pm1:1", INTO_METER_DB),
     FiberSpec("ocs1:18", "pm1:2", INTO_METER_DB),
     # Through the switch into the mesh, and from two of its outputs to the meter.
     FiberSpec("ocs1:19", "mesh:1", INTO_MESH_DB),
     FiberSpec("mesh:9", "pm1:3", INTO_METER_DB),
     FiberSpec("mesh:10", "pm1:4", INTO_METER_DB)])

SPECS = [
    EmulatorSpec("ocs1", "polatis", {"size": "16x16", "loss_db": SWITCH_DB},
                 {"switch_time_ms": 2.0, "jitter_ms": 0.5}),
    EmulatorSpec("pm1", "keysight", {"model": "N7744A", "noise_db": 0.0}),
    EmulatorSpec("pm2", "thorlabs", {"noise_db": 0.0}),
    EmulatorSpec("mesh", "mesh", {"ports": 8}, {}, serve={"serial": ServeSpec(serve="pty")}),
]


def through_switch(laser: str) -> float:
    """What a meter reads of ``laser`` through one circuit of the switch."""
    return LAUNCH[laser] - INTO_SWITCH_DB - SWITCH_DB - INTO_METER_DB


class ServedLab:
    """The emulated lab on its own loop in its own thread; :meth:`call` runs a function of
    the lab there (its state belongs to that loop)."""

    def __init__(self) -> None:
        self.lab = EmulatedLab(SPECS, optics=WIRING, control=False)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="emulated-lab",
                                       daemon=True)

    def __enter__(self) -> ServedLab:
        self.thread.start()
        self.run(self.lab.start())
        return self

    def __exit__(self, *_: object) -> None:
        self.run(self.lab.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def call(self, fn: Callable[[], T]) -> T:
        async def on_loop() -> T:
            return fn()

        return self.run(on_loop())

    def address(self, emulator: str) -> str:
        interfaces = self.lab.endpoints[emulator]
        return interfaces.get("scpi") or interfaces["serial"]

    def circuits(self, emulator: str) -> dict[int, int]:
        """The emulator's true map: what the switch really holds."""
        state = self.call(lambda: self.lab.truth(emulator, light=False)["state"])
        return {int(a): int(b) for a, b in state["connections"]}


@pytest.fixture
def served_lab() -> Iterator[ServedLab]:
    """A Polatis 16x16 (ocs1) feeding a Keysight N7744A (pm1) directly and through an 8x8
    mesh; a Thorlabs PM100 (pm2) on nothing. See WIRING."""
    with ServedLab() as served:
        yield served
