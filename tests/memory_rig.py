"""An engine on emulated instruments in this process, reached over the in-memory link: no
socket, no daemon, a real store (SQLite in the test's directory).

    async with memory_engine(tmp_path, switch(size="8x8")) as bench:
        await bench.engine.reconfigure("ocs1", connect=[(1, 9)])
        bench.circuits("ocs1")  # the emulator's ground truth

The emulators are built as ``labd emulate`` builds them (labd.emulation.emulators) but
never started: their protocol interfaces are served on ``memory://`` addresses, and the
drivers are made from the lab file's entries as the daemon makes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from emulators.lab import EmulatedLab, switch_of
from emulators.physics.crossconnect import SwitchModel
from instruments.instrument import Instrument as Driver
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from instruments.transports.memory import serve as serve_memory
from instruments.transports.memory import sessions, withdraw
from labd.emulation.emulators import EMULATION, emulated_lab
from labd.events import EventHub
from labd.fabric.drivers import make_driver
from labd.fabric.engine import Engine
from labd.lab.file import Lab, load_lab
from labd.store import Store
from tests.labs import write_lab


@dataclass
class MemoryBench:
    lab: Lab
    emulated: EmulatedLab
    """The emulators (not started: nothing listens), for their ground truth and faults."""
    addresses: dict[str, str]
    """Each instrument's ``memory://`` address."""
    drivers: dict[str, Driver]
    store: Store
    hub: EventHub
    engine: Engine

    def model(self, switch: str) -> SwitchModel:
        model = switch_of(self.emulated.device(switch))
        assert model is not None
        return model

    def circuits(self, switch: str) -> dict[int, int]:
        """What the emulated switch truly holds."""
        return dict(self.model(switch).connections)


@contextlib.contextmanager
def served_lab(emulated: EmulatedLab, lab: Lab) -> Iterator[dict[str, str]]:
    """Each emulated instrument's protocol interface (the one its driver speaks) on the
    in-memory link, for the length of the block: instrument id → address."""
    addresses: dict[str, str] = {}
    try:
        for entry in lab.instrument:
            interface = emulated.device(entry.id).interfaces()[EMULATION[entry.driver][1]]
            addresses[entry.id] = serve_memory(sessions(interface))
        yield addresses
    finally:
        for address in addresses.values():
            withdraw(address)


@contextlib.asynccontextmanager
async def memory_engine(tmp_path: Path, *parts: str, tag: str = "mem",
                        light_window_s: float | None = None) -> AsyncIterator[MemoryBench]:
    """An engine on a lab of ``parts`` (tests.labs; every instrument emulated), its
    drivers open on the in-memory link, its store empty."""
    _, path = write_lab(tmp_path, tag, *parts)
    lab = load_lab(path)
    emulated, _ = emulated_lab(lab)
    store = Store(tmp_path / "memory.sqlite")
    await store.open()
    drivers: dict[str, Driver] = {}
    try:
        with served_lab(emulated, lab) as addresses:
            for entry in lab.instrument:
                drivers[entry.id] = make_driver(entry, addresses[entry.id])
            for driver in drivers.values():
                await driver.open()
            hub = EventHub()
            engine = Engine(lab, {k: d for k, d in drivers.items()
                                  if isinstance(d, OpticalSwitch)},
                            {k: d for k, d in drivers.items() if isinstance(d, PowerMeter)},
                            store, hub, light_window_s=light_window_s)
            await engine.load_intended()
            yield MemoryBench(lab, emulated, addresses, drivers, store, hub, engine)
    finally:
        for driver in drivers.values():
            await driver.close()
        await store.close()
