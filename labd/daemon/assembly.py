"""The one place a lab and its settings become a daemon on its instruments.

``labd run`` gives it the settings it resolved (defaults, the lab file's ``[daemon]``
table, ``--config``, ``LABD_*``, flags; labd.settings); a program that starts a daemon (the
emulated rig, ``labd demo``, ``labd measure --lab``, the drills, the pytest plugin, the
benchmarks) names what it sets and takes the rest from the same sources. Either way each
setting is decided here, once: which liveness watch an instrument gets, which database the
store uses under ``--ha``, the broker, the API's keys and TLS. Emulation is not known here:
the emulated rig (labd.emulation.rig) starts the emulators, then asks this module for a
daemon on their addresses.

    built = assemble(lab, db="labd.sqlite", port=0)
    async with built.daemon() as daemon:
        daemon.url
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labd.daemon.access import Access, ApiSettings
from labd.daemon.core import DEFAULT_PORT, Daemon
from labd.daemon.placement import Cpu
from labd.ha.role import HaSettings
from labd.lab.loader import Lab
from labd.mqtt.credentials import BusSettings
from labd.settings import Resolved, Settings, layered
from labd.token import read_token_file

__all__ = ["Assembly", "api_settings", "assemble", "from_settings", "lab_settings",
           "with_watch"]


@dataclass(frozen=True)
class Assembly:
    """Everything a daemon is built from, each setting already decided."""

    lab: Lab
    """The lab, each instrument with the liveness watch it gets (:func:`with_watch`)."""
    db: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    """The daemon's admin key; None: ``$LABD_TOKEN`` or the token file (labd.token)."""
    api: ApiSettings = field(default_factory=ApiSettings)
    bus: str | BusSettings | None = None
    """The broker: its URL, or the settings with the lab instance and keys."""
    restore: bool = True
    light_window_s: float | None = None
    ha: HaSettings | None = None
    cpu: Cpu | None = None

    @property
    def emulates(self) -> bool:
        """Whether an entry of the lab says ``emulate = true`` (an instrument or a host):
        such a lab runs on the emulated rig (labd.emulation.rig), which wraps this."""
        return any(e.emulate for e in self.lab.instrument) or any(
            h.emulate for h in self.lab.host)

    def replace(self, **changes: Any) -> Assembly:
        return dataclasses.replace(self, **changes)

    def daemon(self, addresses: Mapping[str, str] | None = None) -> Daemon:
        """The daemon, not yet started (``async with``); ``addresses``: where instruments
        that the lab file gives no address of listen (the emulators')."""
        return Daemon(self.lab, db=self.db, addresses=dict(addresses or {}), host=self.host,
                      port=self.port, token=self.token, restore=self.restore,
                      light_window_s=self.light_window_s, mqtt=self.bus, api=self.api,
                      ha=self.ha, cpu=self.cpu)


def with_watch(lab: Lab, interval: float | None) -> Lab:
    """The lab with ``interval`` (the ``watch_interval_s`` setting) as the liveness watch of
    every entry that sets none of its own: the entry's own value wins, then the setting,
    then the entry's default."""
    if interval is None:
        return lab
    entries = [e if "watch_interval_s" in e.model_fields_set
               else e.model_copy(update={"watch_interval_s": interval})
               for e in lab.instrument]
    return lab.model_copy(update={"instrument": entries})


def lab_settings(lab: Lab, *, config: str | os.PathLike[str] | None = None,
                 flags: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> Resolved:
    """The settings of a daemon on ``lab``: the defaults, the lab's ``[daemon]`` table, a
    settings file's, ``LABD_*`` (``env``, default this process's) and ``flags``, each over
    the one before (labd.settings.layered, as ``labd run`` resolves them)."""
    table = (lab.source or lab.lab.name, lab.daemon) if lab.daemon else None
    return layered(table, config=config, flags=flags, env=env)


def api_settings(settings: Settings) -> ApiSettings:
    """How the API meets the network, from the settings (AccessError: a file that cannot be
    read, a certificate that cannot be used)."""
    return ApiSettings(access=Access.load(settings.access) if settings.access else None,
                       open_reads=settings.open_reads, max_body=settings.max_body,
                       tls_cert=settings.tls_cert, tls_key=settings.tls_key,
                       open_metrics=not settings.metrics_need_key)


def from_settings(lab: Lab, resolved: Resolved) -> Assembly:
    """``labd run``'s daemon: every part from ``resolved``. Under ``--ha`` the store is the
    lease's database unless a source named another. LabdError for a file that cannot be
    used (the token's, the access file, the broker's credentials)."""
    settings = resolved.settings
    db, ha = settings.db, None
    if settings.ha_url is not None:
        ha = HaSettings(settings.ha_url, settings.lease_renew_s, settings.lease_ttl_s)
        if resolved.source("db") == "default":
            db = settings.ha_url
    bus = (BusSettings.load(settings.mqtt, settings.mqtt_credentials, settings.instance)
           if settings.mqtt else None)
    token = read_token_file(Path(settings.token_file)) if settings.token_file else None
    return Assembly(with_watch(lab, settings.watch_interval_s), db=db, host=settings.host,
                    port=settings.port, token=token, api=api_settings(settings), bus=bus,
                    restore=settings.restore, ha=ha, cpu=settings.cpu)


def assemble(lab: Lab, *, db: str, host: str = "127.0.0.1", port: int = 0,
             token: str | None = None, api: ApiSettings | None = None,
             mqtt: str | BusSettings | None = None, restore: bool = True,
             light_window_s: float | None = None, ha: HaSettings | None = None,
             cpu: Cpu | None = None, env: Mapping[str, str] | None = None) -> Assembly:
    """A program's daemon: what it names here (``mqtt`` None: no broker; ``ha`` None: it
    runs alone), the rest as ``labd run`` would take it from the lab's ``[daemon]`` table
    and ``LABD_*`` (``env``): the liveness watch, and the API's keys and TLS and the CPU
    where ``api`` and ``cpu`` are not given."""
    settings = lab_settings(lab, env=env).settings
    return Assembly(with_watch(lab, settings.watch_interval_s), db=db, host=host, port=port,
                    token=token, api=api if api is not None else api_settings(settings),
                    bus=mqtt, restore=restore, light_window_s=light_window_s, ha=ha,
                    cpu=cpu if cpu is not None else settings.cpu)
