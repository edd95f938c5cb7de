"""QCoDeS Instruments on a running daemon (the ``qcodes`` extra): every set is a request to
the daemon's API, every get a read of it. A Station YAML builds them like any instrument::

    instruments:
      ocs:
        type: labd.adapters.qcodes.DaemonSwitchInstrument
        init: {switch: ocs1, url: "http://rack:8470", ports: [1, 2]}
      pm:
        type: labd.adapters.qcodes.DaemonMeterInstrument
        init: {meter: pm1, url: "http://rack:8470", channels: [1, 2]}

(``lab: lab.toml`` in place of ``url``: the daemon that lab file runs; the key is
``token:``, else ``$LABD_TOKEN`` or the token file.)

- :class:`DaemonSwitchInstrument`: ``cross_connects`` (a dict, ingress → egress); per port
  ``port<n>.output`` (an int: the port it is in circuit with, 0 for none; settable, so
  ``dond`` sweeps it) and ``port<n>.power`` (dBm at the meter channel its output feeds);
- :class:`DaemonMeterInstrument`: per channel ``ch<n>.power`` (dBm), and
  :meth:`~DaemonMeterInstrument.read_series`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

try:
    from qcodes.instrument import ChannelTuple, Instrument, InstrumentChannel
    from qcodes.parameters import Parameter
    from qcodes.validators import Dict, Ints
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("labd.adapters.qcodes needs qcodes: pip install 'labd[qcodes]'"
                      ) from exc

from labd.adapters.blocking import DaemonLab, LabHold, LabMeter, LabSwitch
from labd.adapters.daemon import HOLD_TTL_S


def _lab(daemon: DaemonLab | None, url: str | None, token: str | None,
         lab: str | os.PathLike[str] | None) -> tuple[DaemonLab, bool]:
    """The daemon to use, and whether it is the instrument's own (closed with it)."""
    if daemon is not None:
        return daemon, False
    return DaemonLab(url, token=token, lab=lab).open(), True


class DaemonSwitchPort(InstrumentChannel["DaemonSwitchInstrument"]):
    """One port: ``output`` (int; 0: in no circuit) and ``power`` (dBm; NaN where its
    output feeds no meter)."""

    def __init__(self, parent: DaemonSwitchInstrument, port: int, size: int) -> None:
        super().__init__(parent, f"port{port}")
        self.port = port
        switch = parent.switch
        self.output: Parameter = self.add_parameter(
            "output", label=f"port {port} output", get_cmd=lambda: switch.output(port),
            set_cmd=lambda out: switch.set_output(port, out), vals=Ints(0, size),
            docstring="the port in circuit with this one (0: none); set: one "
                      "reconfiguration by the daemon")
        self.power: Parameter = self.add_parameter(
            "power", label=f"port {port} power", unit="dBm",
            get_cmd=lambda: switch.power(port), set_cmd=False,
            docstring="at the meter channel this port's output feeds")


class DaemonSwitchInstrument(Instrument):
    """A switch of a running daemon. ``ports`` names the ports made channels (default:
    every port; a snapshot with ``update=True`` reads each one). Give ``url`` (and
    ``token``), ``lab`` (the lab file the daemon runs) or ``daemon``, a shared
    :class:`~labd.adapters.blocking.DaemonLab`."""

    def __init__(self, name: str, switch: str, *, ports: Iterable[int] | None = None,
                 url: str | None = None, token: str | None = None,
                 lab: str | os.PathLike[str] | None = None, daemon: DaemonLab | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        try:
            self.daemon, self._own = _lab(daemon, url, token, lab)
            self.switch: LabSwitch = self.daemon.switch(switch)
            size = len(self.daemon.get(f"/v1/switches/{switch}/ports"))
        except BaseException:
            super().close()  # QCoDeS keeps every instrument by name until it is closed
            raise
        self.cross_connects: Parameter = self.add_parameter(
            "cross_connects", label="cross-connects", get_cmd=self.switch.cross_connects,
            set_cmd=self.switch.replace, vals=Dict(),
            docstring="ingress (or lower) port → egress (or higher) port; set: exactly "
                      "these circuits, one reconfiguration by the daemon")
        channels = [DaemonSwitchPort(self, p, size)
                    for p in (range(1, size + 1) if ports is None else ports)]
        for channel in channels:
            self.add_submodule(channel.short_name, channel)
        # Not in the snapshot: each port is there once already, as port<n>.
        self.ports: ChannelTuple[DaemonSwitchPort] = self.add_submodule(
            "ports", ChannelTuple(self, "ports", DaemonSwitchPort, channels,
                                  snapshotable=False))

    def port(self, port: int) -> DaemonSwitchPort:
        """The channel of ``port`` (its number, not its place in :attr:`ports`)."""
        channel = self.submodules.get(f"port{port}")
        if not isinstance(channel, DaemonSwitchPort):
            raise KeyError(f"{self.name} has no channel for port {port}")
        return channel

    def hold(self, ports: Iterable[int], *, holder: str = "a QCoDeS measurement",
             ttl_s: float = HOLD_TTL_S) -> LabHold:
        """``with ocs.hold([1, 17, 18]):`` others' changes to these ports are refused,
        naming ``holder``, while this instrument's go through."""
        return self.daemon.hold(self.switch.id, ports, holder=holder, ttl_s=ttl_s)

    def get_idn(self) -> dict[str, str | None]:
        entry = self.daemon.get(f"/v1/instruments/{self.switch.id}")
        identity = entry.get("identity") or {}
        return {"vendor": identity.get("vendor"), "model": identity.get("model"),
                "serial": identity.get("serial") or None,
                "firmware": identity.get("firmware") or None}

    def close(self) -> None:
        if getattr(self, "_own", False):
            self.daemon.close()
        super().close()


class DaemonMeterChannel(InstrumentChannel["DaemonMeterInstrument"]):
    """One channel: ``power`` in dBm (NaN over range), read on demand."""

    def __init__(self, parent: DaemonMeterInstrument, channel: int) -> None:
        super().__init__(parent, f"ch{channel}")
        self.channel = channel
        meter = parent.meter
        self.power: Parameter = self.add_parameter(
            "power", label=f"channel {channel} power", unit="dBm",
            get_cmd=lambda: meter.read_power(channel), set_cmd=False)


class DaemonMeterInstrument(Instrument):
    """A power meter of a running daemon, a channel ``ch<n>`` for each of its channels (or
    those named)."""

    def __init__(self, name: str, meter: str, *, channels: Iterable[int] | None = None,
                 url: str | None = None, token: str | None = None,
                 lab: str | os.PathLike[str] | None = None, daemon: DaemonLab | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        try:
            self.daemon, self._own = _lab(daemon, url, token, lab)
            self.meter: LabMeter = self.daemon.meter(meter)
        except BaseException:
            super().close()
            raise
        count = int(self.meter.info["channels"])
        made = [DaemonMeterChannel(self, c)
                for c in (range(1, count + 1) if channels is None else channels)]
        for channel in made:
            self.add_submodule(channel.short_name, channel)
        self.channels: ChannelTuple[DaemonMeterChannel] = self.add_submodule(
            "channels", ChannelTuple(self, "channels", DaemonMeterChannel, made,
                                     snapshotable=False))

    def read_series(self, channels: Sequence[int] | None = None, *, points: int,
                    interval_s: float | None = None) -> dict[int, list[float]]:
        """``points`` readings per channel, ``interval_s`` apart on a meter that logs."""
        return self.meter.read(channels, points=points, interval_s=interval_s)

    def get_idn(self) -> dict[str, str | None]:
        entry = self.daemon.get(f"/v1/instruments/{self.meter.id}")
        identity = entry.get("identity") or {}
        return {"vendor": identity.get("vendor"), "model": identity.get("model"),
                "serial": identity.get("serial") or None,
                "firmware": identity.get("firmware") or None}

    def close(self) -> None:
        if getattr(self, "_own", False):
            self.daemon.close()
        super().close()


__all__ = ["DaemonMeterChannel", "DaemonMeterInstrument", "DaemonSwitchInstrument",
           "DaemonSwitchPort"]
