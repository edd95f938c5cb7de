"""Light-verification drills: move light onto (and off) a metered path many times and set
the moment labd detected it beside the moment the optical model says it happened."""

from __future__ import annotations

from collections.abc import Callable

from instruments.light import LightWatch
from instruments.meter import PowerMeter
from instruments.switch import OpticalSwitch
from labd.client.control import Backdoor
from labd.lab.wiring import MeteredPath


async def light_drill(switch: OpticalSwitch, meter: PowerMeter, path: MeteredPath,
                      backdoor: Backdoor, events: int, *, threshold_dbm: float,
                      window_s: float, resolution_s: float, dark_ingress: int | None = None,
                      progress: Callable[[], None] | None = None) -> list[float]:
    """Detection error (µs, detected - true) of ``events`` light arrivals and departures.

    A mesh always sends every input somewhere, so light leaves its path by routing an
    unlit input (``dark_ingress``) onto it; a switch simply disconnects."""
    node = f"{path.meter}:{path.channel}"
    dark = {dark_ingress: path.egress} if dark_ingress is not None else {}
    before = dict(switch.expected)
    await switch.replace(dark)
    try:
        return await _drill(switch, meter, path, backdoor, events, node, dark,
                            threshold_dbm, window_s, resolution_s, progress)
    finally:  # leave the switch as the daemon intends it
        await switch.replace(before)


async def _drill(switch: OpticalSwitch, meter: PowerMeter, path: MeteredPath,
                 backdoor: Backdoor, events: int, node: str, dark: dict[int, int],
                 threshold_dbm: float, window_s: float, resolution_s: float,
                 progress: Callable[[], None] | None) -> list[float]:
    errors: list[float] = []
    for i in range(events):
        arriving = i % 2 == 0
        seen = await backdoor.light()
        last = seen[-1]["seq"] if seen else 0
        watch = await LightWatch.start(meter, [path.channel], present=arriving,
                                       threshold_dbm=threshold_dbm, window_s=window_s,
                                       resolution_s=resolution_s)
        if arriving:
            await switch.replace({path.ingress: path.egress})
        elif dark:
            await switch.replace(dark)
        else:
            await switch.disconnect([path.ingress])
        detected = (await watch.result())[path.channel]
        truth = [c for c in await backdoor.light(last) if c["node"] == node]
        if truth:
            errors.append((detected - truth[0]["at_ns"]) / 1e3)
        if progress is not None:
            progress()
    return errors
