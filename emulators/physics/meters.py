"""What every emulated optical power meter shares: its channels look at nodes of the
optical model, average over a window, add a little noise, and can be made to fail.

Meter faults (control endpoint, per channel or all): ``no_sensor`` (the head is
unplugged: reads fail), ``saturation`` (reads return the over-range sentinel), ``stuck``
(reads repeat the last value from before the fault).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np

from emulators.physics.optics import DARK_DBM, OpticalModel, to_dbm

METER_FAULTS = ("no_sensor", "saturation", "stuck")
#: Sub-samples averaged inside one averaging window.
_SUBSAMPLES = 4


class SensorMissing(Exception):
    """A read on a channel whose sensor is missing."""


@dataclass
class ChannelState:
    wavelength_nm: float = 1550.0
    unit_watts: bool = False
    range_dbm: float = 10.0
    auto_range: bool = True
    atime_s: float = 0.1
    last_dbm: float = DARK_DBM
    fault: str | None = None
    offset_db: float = 0.0  # from zeroing


class MeterModel:
    """``atime_s``, ``unit_watts`` and ``wavelength_nm`` are the meter's power-on (and
    ``*RST``) settings of every channel."""

    def __init__(self, name: str, channels: int, *, noise_db: float = 0.01,
                 overrange: float = 9.91e37, atime_s: float = 0.1, unit_watts: bool = False,
                 wavelength_nm: float = 1550.0, seed: int | None = None) -> None:
        self.name = name
        self.channels = channels
        self.noise_db = noise_db
        self.overrange = overrange
        self.power_on = ChannelState(wavelength_nm=wavelength_nm, unit_watts=unit_watts,
                                     atime_s=atime_s)
        self.optics: OpticalModel | None = None
        self.state = {c: dataclasses.replace(self.power_on) for c in range(1, channels + 1)}
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)

    def node(self, channel: int) -> str:
        return f"{self.name}:{channel}"

    def reset(self) -> None:
        """Power-on: the power-on settings, heads back, nothing measured yet."""
        self.state = {c: dataclasses.replace(self.power_on) for c in range(1, self.channels + 1)}

    def preset(self) -> None:
        """``*RST``: every channel's settings back to power-on; what is not a setting stays
        (a missing head stays missing, a zeroing's offset and the last reading stay)."""
        self.state = {c: dataclasses.replace(self.power_on, fault=s.fault, offset_db=s.offset_db,
                                             last_dbm=s.last_dbm)
                      for c, s in self.state.items()}

    def set_fault(self, channel: int | None, fault: str | None) -> None:
        for c in [channel] if channel else list(self.state):
            if c not in self.state:
                raise ValueError(f"meter {self.name} has channels 1..{self.channels}, "
                                 f"not {c}")
            self.state[c].fault = fault

    def true_dbm(self, channel: int, times: np.ndarray) -> np.ndarray:
        if self.optics is None:
            return np.full(times.shape, DARK_DBM)
        return self.optics.dbm(self.node(channel), times)

    def windows_dbm(self, channel: int, start_ns: int, atime_s: float, count: int
                    ) -> np.ndarray:
        """Average power (dBm) over ``count`` consecutive windows of ``atime_s`` from
        ``start_ns``, as the meter reports them (noise, faults and range included)."""
        state = self.state[channel]
        if state.fault == "no_sensor":
            raise SensorMissing(f"{self.name} channel {channel}: no sensor")
        width = max(1, int(atime_s * 1e9))
        offsets = (np.arange(_SUBSAMPLES) + 0.5) * width / _SUBSAMPLES
        times = (start_ns + np.arange(count)[:, None] * width + offsets[None, :]).astype(
            np.int64)
        mw = 10 ** (self.true_dbm(channel, times.ravel()).reshape(times.shape) / 10)
        dbm = to_dbm(mw.mean(axis=1))
        if self.noise_db:
            dbm = dbm + self._np_rng.normal(0.0, self.noise_db, dbm.shape)
        dbm = dbm - state.offset_db
        if state.fault == "stuck":
            return np.full(dbm.shape, state.last_dbm)
        if state.fault == "saturation":
            return np.full(dbm.shape, np.inf)
        limit = 10.0 if state.auto_range else state.range_dbm + 3.0
        dbm = np.where(dbm > limit, np.inf, dbm)
        if count:
            finite = dbm[np.isfinite(dbm)]
            if finite.size:
                state.last_dbm = float(finite[-1])
        return dbm

    def in_unit(self, channel: int, dbm: np.ndarray) -> np.ndarray:
        """dBm → the channel's unit; over-range becomes the sentinel."""
        values = 10 ** (dbm / 10) / 1000 if self.state[channel].unit_watts else dbm
        out: np.ndarray = np.where(np.isfinite(dbm), values, self.overrange)
        return out
