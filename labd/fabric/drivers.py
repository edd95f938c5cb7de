"""From lab-file entries to live drivers."""

from __future__ import annotations

from typing import Any

from instruments.instrument import Instrument as Driver
from instruments.keysight import KeysightN77xx
from instruments.link import LinkSettings
from instruments.meter import PowerMeter
from instruments.registry import switch_driver
from instruments.switch import OpticalSwitch
from instruments.thorlabs import ThorlabsPM100
from labd.errors import LabFileError
from labd.lab.loader import (
    CalientTl1Entry,
    Instrument,
    KeysightEntry,
    MeshEntry,
    SwitchEntry,
    ThorlabsEntry,
    Tl1Credentials,
)


def link_settings(entry: Instrument, defaults: LinkSettings) -> LinkSettings:
    return LinkSettings(
        write_termination=entry.write_termination if entry.write_termination is not None
        else defaults.write_termination,
        read_termination=entry.read_termination if entry.read_termination is not None
        else defaults.read_termination,
        timeout=entry.timeout if entry.timeout is not None else defaults.timeout,
        query_delay=entry.query_delay or defaults.query_delay,
        encoding=defaults.encoding,
    )


def make_driver(entry: Instrument, address: str | None = None, *, source: str = "lab file"
                ) -> Driver:
    """A driver (not yet open) for any instrument entry; ``address`` overrides the entry's
    (an emulator's resolved endpoint). ``source`` names the lab file in errors."""
    where = address or entry.address
    if where is None:
        raise LabFileError(source, [f"{source}: instrument {entry.id!r}: no address, and no "
                                    "emulator started for it"])
    options: dict[str, Any] = {}
    cls: type[Driver]
    if isinstance(entry, SwitchEntry):
        cls = switch_driver(entry.driver)
        options["size"] = entry.size
        options["audit_interval_s"] = entry.audit_interval_s
    elif isinstance(entry, KeysightEntry):
        cls = KeysightN77xx
        if entry.channels:
            options["channels"] = entry.channels
    elif isinstance(entry, ThorlabsEntry):
        cls = ThorlabsPM100
    else:  # pragma: no cover - the lab file's union is closed
        raise ValueError(f"no driver for {entry.driver!r}")
    if isinstance(entry, Tl1Credentials):
        try:
            password = entry.resolved_password()
        except ValueError as exc:
            raise LabFileError(source, [f"{source}: instrument {entry.id!r}, {exc}"]) from None
        options.update(user=entry.user, password=password, tid=entry.tid)
    if isinstance(entry, CalientTl1Entry):
        options.update(ports_per_slot=entry.ports_per_slot, group=entry.group,
                       aid_lists=entry.aid_lists)
    if isinstance(entry, MeshEntry):
        options.update(v_pi=entry.v_pi, calibration=entry.calibration,
                       settle_us=entry.settle_us, **entry.limit_options())
    return cls(where, name=entry.id, settings=link_settings(entry, cls.default_settings),
               watch_interval_s=entry.watch_interval_s, **options)


def make_switch(entry: Instrument, address: str | None = None, *, source: str = "lab file"
                ) -> OpticalSwitch:
    driver = make_driver(entry, address, source=source)
    if not isinstance(driver, OpticalSwitch):
        raise ValueError(f"instrument {entry.id!r} ({entry.driver}) is not a switch")
    return driver


def make_meter(entry: Instrument, address: str | None = None, *, source: str = "lab file"
               ) -> PowerMeter:
    driver = make_driver(entry, address, source=source)
    if not isinstance(driver, PowerMeter):
        raise ValueError(f"instrument {entry.id!r} ({entry.driver}) is not a power meter")
    return driver
