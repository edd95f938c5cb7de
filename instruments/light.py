"""Light verification: wait until light is present (or gone) on meter channels, and say
when it happened.

Start a :class:`LightWatch` *before* the change that should move the light, make the change,
then await :meth:`LightWatch.result`::

    watch = await LightWatch.start(meter, [1, 2], present=True, window_s=0.1)
    await switch.connect([(1, 17), (2, 18)])
    arrived = await watch.result()          # {1: monotonic ns, 2: monotonic ns}

``present`` may also say per channel what is awaited (``{1: True, 2: False}``: light on 1,
none on 2), so one watch, armed in one exchange, covers a change that moves light both ways.

A meter with a logging function (Keysight N77xx) records one trace per channel over
``window_s`` at ``resolution_s`` and the crossing is interpolated between samples; others are
polled, and each reading is placed at the middle of its round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from instruments.errors import InstrumentError, InstrumentTimeout
from instruments.meter import PowerMeter


class LightTimeout(InstrumentTimeout):
    """The light did not arrive (or leave) in time; the message gives the last level seen."""


@dataclass
class LightWatch:
    meter: PowerMeter
    wanted: dict[int, bool]
    """Per channel: True awaits light present, False light gone."""
    threshold_dbm: float
    window_s: float
    resolution_s: float
    started_ns: int = 0
    traces: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """The logged power (dBm) per channel, sample i covering started_ns + i * resolution_s;
    filled by :meth:`result` on meters that log."""
    _poller: asyncio.Task[dict[int, int]] | None = field(default=None, repr=False)

    @classmethod
    async def start(cls, meter: PowerMeter, channels: list[int], *,
                    present: bool | Mapping[int, bool] = True, threshold_dbm: float = -30.0,
                    window_s: float = 0.2, resolution_s: float = 1e-4) -> LightWatch:
        """Begin watching. ``present``: what to await, on every channel or per channel;
        ``window_s`` bounds the wait (the timeout); ``resolution_s`` is the logging sample
        time on meters that log."""
        for channel in channels:
            meter.check_channel(channel)
        wanted = {c: (present if isinstance(present, bool) else bool(present[c]))
                  for c in channels}
        watch = cls(meter, wanted, threshold_dbm, window_s, resolution_s)
        if meter.supports_logging:
            points = max(1, math.ceil(window_s / resolution_s))
            watch.started_ns = await meter.start_logging(watch.channels, points, resolution_s)
        else:
            watch.started_ns = time.monotonic_ns()
            watch._poller = asyncio.create_task(watch._poll(), name=f"light-{meter.name}")
        return watch

    @property
    def channels(self) -> list[int]:
        return list(self.wanted)

    def _met(self, channel: int, dbm: float) -> bool:
        return dbm >= self.threshold_dbm if self.wanted[channel] else dbm < self.threshold_dbm

    async def result(self) -> dict[int, int]:
        """Monotonic ns at which each channel crossed the threshold. Raises
        :class:`LightTimeout` naming the channels that did not."""
        if self._poller is not None:
            return await self._poller
        end = self.started_ns + int(self.window_s * 1e9)
        await asyncio.sleep(max(0.0, (end - time.monotonic_ns()) / 1e9))
        for channel in self.channels:
            # Ask at a tenth of the sample rate; allow the whole window again for stragglers.
            await self.meter.wait_logging(channel, poll_s=self.resolution_s * 10,
                                          timeout_s=self.window_s + 1.0)
        found: dict[int, int] = {}
        missing: list[str] = []
        for channel in self.channels:
            trace = await self.meter.fetch_log(channel)
            self.traces[channel] = trace
            at = self._crossing(channel, trace)
            if at is None:
                missing.append(self._missing(channel, trace[-1] if trace.size else math.nan))
            else:
                found[channel] = at
        if missing:
            raise self._timeout(missing)
        return found

    def _crossing(self, channel: int, trace: np.ndarray) -> int | None:
        met = trace >= self.threshold_dbm if self.wanted[channel] else trace < self.threshold_dbm
        hits = np.flatnonzero(met)
        if hits.size == 0:
            return None
        i = int(hits[0])
        step = self.resolution_s * 1e9
        if i == 0:  # already so when the watch began
            return self.started_ns
        # Sample i averages [i, i+1) * step; interpolate between the centres of i-1 and i.
        before, after = float(trace[i - 1]), float(trace[i])
        frac = 0.5
        if math.isfinite(before) and math.isfinite(after) and after != before:
            frac = min(1.0, max(0.0, (self.threshold_dbm - before) / (after - before)))
        return self.started_ns + int((i - 0.5 + frac) * step)

    async def _poll(self) -> dict[int, int]:
        deadline = self.started_ns + int(self.window_s * 1e9)
        pending = set(self.channels)
        found: dict[int, int] = {}
        previous: dict[int, float] = {}
        last: dict[int, float] = {}
        while pending:
            for channel in sorted(pending):
                sent = time.monotonic_ns()
                dbm = await self.meter.read_power(channel)
                received = time.monotonic_ns()
                last[channel] = dbm
                if self._met(channel, dbm):
                    found[channel] = await self._locate(channel, sent, received, dbm,
                                                        previous.get(channel))
                    pending.discard(channel)
                previous[channel] = dbm
            if pending and time.monotonic_ns() > deadline:
                raise self._timeout([self._missing(c, last[c]) for c in sorted(pending)])
        return found

    async def _locate(self, channel: int, sent: int, received: int, dbm: float,
                      before: float | None) -> int:
        """Place the change inside the reading that saw it. The reading averaged over
        [received - W, received]; a step at x leaves a fraction of the full power in the
        average that tells where x fell. The full power is the next reading (light came)
        or the previous one (light went)."""
        width = int(self.meter.window_s(channel) * 1e9)
        if width <= 0 or before is None:
            return (sent + received) // 2
        end = received
        start = max(sent, end - width)
        if self.wanted[channel]:
            full = await self.meter.read_power(channel)
            fraction = _ratio(dbm, full)
            return int(end - fraction * (end - start))
        fraction = _ratio(dbm, before)
        return int(start + fraction * (end - start))

    def _missing(self, channel: int, last_dbm: float) -> str:
        wanted = "present" if self.wanted[channel] else "gone"
        return f"not {wanted} on channel {channel} (last {last_dbm:.1f} dBm)"

    def _timeout(self, missing: list[str]) -> LightTimeout:
        return LightTimeout(f"light {'; '.join(missing)} within {self.window_s:g} s of the "
                            f"watch starting (threshold {self.threshold_dbm:g} dBm)",
                            instrument=self.meter.name)

    async def cancel(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, InstrumentError):
                await self._poller


def _ratio(part_dbm: float, full_dbm: float) -> float:
    """Linear power ratio, clipped to 0..1 (over-range counts as full)."""
    if not math.isfinite(part_dbm) or not math.isfinite(full_dbm):
        return 1.0
    return min(1.0, max(0.0, 10 ** ((part_dbm - full_dbm) / 10)))


async def wait_for_light(meter: PowerMeter, channels: list[int], *, present: bool = True,
                         threshold_dbm: float = -30.0, timeout: float = 0.2,
                         resolution_s: float = 1e-4) -> dict[int, int]:
    """Watch from now until the light is present (or gone); for a change already made."""
    watch = await LightWatch.start(meter, channels, present=present,
                                   threshold_dbm=threshold_dbm, window_s=timeout,
                                   resolution_s=resolution_s)
    return await watch.result()
