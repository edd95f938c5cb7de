"""Light verification for the engine: the meters watch the paths a change lights or darkens.

A request on a metered path arms one watch per meter before its command leaves; the engine
waits for the light (or its absence) after the device acknowledged, and keeps the logged
power with the change's record.
"""

from __future__ import annotations

from collections.abc import Mapping

from instruments.errors import InstrumentError
from instruments.light import LightWatch
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch, Pair
from labd.errors import StoreError
from labd.events import EventHub
from labd.lab.loader import Lab
from labd.lab.wiring import MeteredPath, metered_paths
from labd.store.models import PowerTrace
from labd.store.writer import Store

__all__ = ["MAX_LOG_POINTS", "Watched", "Watches", "log_resolution"]

#: The most points a light-verification log takes per channel.
MAX_LOG_POINTS = 20_000

#: The metered paths a request lights (True) or darkens (False), by (meter, channel).
Watched = dict[tuple[str, int], tuple[MeteredPath, bool]]


def log_resolution(window_s: float, finest_s: float) -> float:
    """The sample time for a light-verification log over ``window_s``: ``finest_s``, but
    coarser where the window would take more than a meter's bounded number of points."""
    return max(finest_s, window_s / MAX_LOG_POINTS)


class Watches:
    """The light watches of one lab's switches: which paths a meter sees, how long to wait,
    and the watches of one request armed, awaited, cancelled and kept."""

    def __init__(self, lab: Lab, switches: Mapping[str, OpticalSwitch],
                 meters: Mapping[str, PowerMeter], store: Store, hub: EventHub, *,
                 window_s: float | None, resolution_s: float) -> None:
        self.lab = lab
        self.switches = switches
        self.meters = meters
        self.store = store
        self.hub = hub
        self.window_override_s = window_s
        """Overrides the lab file's light windows (``light_window_ms``) when set."""
        self.resolution_s = resolution_s
        self._paths = {name: [p for p in metered_paths(lab, name) if p.meter in meters]
                       for name in switches}

    def metered(self, switch: str) -> list[MeteredPath]:
        """The paths through ``switch`` whose light a meter sees (light verification)."""
        return list(self._paths[switch])

    def window_s(self, switch: str) -> float:
        """How long light verification waits after a change on ``switch``."""
        if self.window_override_s is not None:
            return self.window_override_s
        return self.lab.light_window_ms(switch) / 1000

    def paths_for(self, name: str, make: list[Pair], brk: list[Pair]) -> Watched:
        """Metered paths the request lights (True) or darkens (False), by meter channel. A
        switch whose disconnects leave the light where it was (a mesh) darkens none."""
        found: Watched = {}
        darkens = self.switches[name].disconnect_darkens
        for pairs, present in ((make, True), (brk, False)):
            if not present and not darkens:
                continue
            for a, b in pairs:
                for path in self._paths[name]:
                    if {path.ingress, path.egress} == {a, b}:
                        found[(path.meter, path.channel)] = (path, present)
        return found

    async def start(self, switch: str, watched: Watched) -> list[LightWatch]:
        # One watch per meter, every channel (light coming or going) armed in one exchange:
        # watches started one after another would each begin their window before the next
        # is armed, and a slow meter would see the first windows end before the change.
        if not watched:  # nothing metered (most requests): no window to work out
            return []
        groups: dict[str, dict[int, bool]] = {}
        for (meter, channel), (_, present) in watched.items():
            groups.setdefault(meter, {})[channel] = present
        window = self.window_s(switch)
        # A long window is logged coarser: a meter holds a bounded number of points.
        resolution = log_resolution(window, self.resolution_s)
        started = []
        for meter, wanted in groups.items():
            channels = sorted(wanted)
            try:
                started.append(await LightWatch.start(
                    self.meters[meter], channels, present=wanted,
                    threshold_dbm=self.lab.lab.light_threshold_dbm,
                    window_s=window, resolution_s=resolution))
            except InstrumentError as exc:
                where = ", ".join(f"{meter}:{c}" for c in sorted(channels))
                self.hub.publish("warning", {"detail": f"light verification on {where} "
                                                       f"unavailable: {exc}"})
        return started

    async def finish(self, watches: list[LightWatch]) -> int:
        """When the last of the watched channels saw its light arrive or leave."""
        try:
            times = [t for w in watches for t in (await w.result()).values()]
        finally:  # one that failed leaves the others' pollers running
            await self.cancel(watches)
        return max(times)

    async def cancel(self, watches: list[LightWatch]) -> None:
        for watch in watches:
            await watch.cancel()

    async def keep_traces(self, watches: list[LightWatch], reconfiguration_id: int) -> None:
        """The power traces light verification logged, kept with the reconfiguration
        (only requests on metered paths have any; they already waited for the log)."""
        rows = [PowerTrace(meter=w.meter.name, channel=channel, start_ns=w.started_ns,
                           atime_s=w.resolution_s, dbm=trace.astype("<f4").tobytes(),
                           reconfiguration_id=reconfiguration_id)
                for w in watches for channel, trace in w.traces.items()]
        if rows:
            try:
                await self.store.write(*rows)
            except StoreError as exc:
                # The change itself is recorded; only its light log is lost.
                self.hub.publish("warning", {"detail": f"the power traces of reconfiguration "
                                                       f"{reconfiguration_id} were not kept: "
                                                       f"{exc}"})
