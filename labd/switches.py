"""From lab-file entries to live drivers."""

from __future__ import annotations

from typing import Any

from instruments.link import LinkSettings
from instruments.registry import switch_driver
from instruments.switch import OpticalSwitch
from labd.errors import LabFileError
from labd.labfile import CalientTl1Entry, Instrument, Tl1Credentials


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


def make_switch(entry: Instrument, address: str | None = None, *, source: str = "lab file"
                ) -> OpticalSwitch:
    """A driver (not yet open) for a switch entry; ``address`` overrides the entry's
    (an emulator's resolved endpoint). ``source`` names the lab file in errors."""
    cls = switch_driver(entry.driver)
    where = address or entry.address
    if where is None:
        raise LabFileError(source, [f"{source}: instrument {entry.id!r}: no address, and no "
                                    "emulator started for it"])
    options: dict[str, Any] = {}
    if isinstance(entry, Tl1Credentials):
        try:
            password = entry.resolved_password()
        except ValueError as exc:
            raise LabFileError(source, [f"{source}: instrument {entry.id!r}, {exc}"]) from None
        options.update(user=entry.user, password=password, tid=entry.tid)
    if isinstance(entry, CalientTl1Entry):
        options.update(ports_per_slot=entry.ports_per_slot, group=entry.group,
                       aid_lists=entry.aid_lists)
    return cls(where, name=entry.id, settings=link_settings(entry, cls.default_settings),
               size=entry.size, **options)
