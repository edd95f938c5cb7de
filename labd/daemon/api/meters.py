"""``/v1/meters``: the lab's power meters, what each channel sees, and readings taken on
demand — one channel, all of them, or a series of N readings at a rate the meter supports
(the N774x logging function) — never polled in the background.

A reading holds its channels as light verification does (the engine's reservations, keys
``("meter:<id>", channel)``), so a series never runs on a channel a reconfiguration is
watching, nor the other way round. Readings are dBm; ``null`` where the meter said over
range (or read no light at all in watts), which JSON cannot write as a number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from pydantic import Field

from instruments.meter import PowerMeter
from labd.daemon.api.bodies import Body
from labd.daemon.api.deps import ServicesDep
from labd.daemon.services import Services
from labd.errors import RequestError

router = APIRouter()

#: The most readings one request returns per channel (a bounded answer).
MAX_POINTS = 100_000
#: The longest a series may take (s): a request is answered while the client waits.
MAX_SERIES_S = 5.0
#: The logging function's averaging times (s), as the N774x takes them.
MIN_INTERVAL_S, MAX_INTERVAL_S = 1e-6, 10.0
#: Time given on top of a log's own length for the meter to say it is complete (s).
LOG_MARGIN_S = 5.0


class ReadBody(Body):
    channels: list[Annotated[int, Field(strict=True, ge=1, le=1024)]] | None = Field(
        None, min_length=1, max_length=1024,
        description="the channels to read; default: every channel of the meter")
    points: int = Field(1, strict=True, ge=1, le=MAX_POINTS,
                        description="readings per channel: 1, or a series")
    interval_s: float | None = Field(
        None, strict=True, ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S, allow_inf_nan=False,
        description="a series' spacing, each reading averaged over it (the logging "
                    "function; a meter without one takes no interval, its readings one "
                    "after another)")


def _meter(services: Services, meter: str) -> PowerMeter:
    meters = services.engine.meters
    driver = meters.get(meter)
    if driver is None:
        raise HTTPException(404, f"no meter {meter!r}; meters: "
                                 f"{', '.join(sorted(meters)) or 'none'}")
    return driver


def _node(text: str | None, meter: str) -> int | None:
    owner, sep, number = (text or "").partition(":")
    return int(number) if sep and owner == meter and number.isdigit() else None


def channel_sources(services: Services, meter: str) -> dict[int, str]:
    """What each channel of ``meter`` is fed from, as the lab file's fibres say: a
    ``switch:port`` or an endpoint id (a tapped fibre: its ``from``)."""
    seen: dict[int, str] = {}
    for fiber in services.lab.fiber:
        for node in (fiber.dst, fiber.tap):
            if (channel := _node(node, meter)) is not None:
                seen.setdefault(channel, fiber.src)
    return seen


def meter_dict(services: Services, name: str, driver: PowerMeter) -> dict[str, Any]:
    info = driver.info
    sources = channel_sources(services, name)
    count = info.channels if info is not None else max(sources, default=0)
    return {"id": name, "driver": type(driver).driver, "state": driver.state.value,
            "channels": count, "logging": driver.supports_logging,
            "sees": [{"channel": c, "from": sources[c]} for c in sorted(sources)]}


@router.get("/v1/meters")
async def meters(services: ServicesDep) -> list[dict[str, Any]]:
    """Each meter: driver, state, channel count, whether it logs (series at a set rate),
    and what each wired channel is fed from."""
    return [meter_dict(services, name, driver)
            for name, driver in services.engine.meters.items()]


@router.get("/v1/meters/{meter}")
async def meter_state(meter: str, services: ServicesDep) -> dict[str, Any]:
    return meter_dict(services, meter, _meter(services, meter))


def _finite(values: Iterable[float]) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]


@router.post("/v1/meters/{meter}/read")
async def read(meter: str, body: ReadBody, services: ServicesDep) -> dict[str, Any]:
    """Readings now: ``{"channels": {"1": [dBm, ...]}, "start_ns", "interval_s",
    "t_ns"}``. One reading per channel by default; ``points`` > 1 with ``interval_s``
    logs a series on the meter (readings ``interval_s`` apart from ``start_ns``, every
    channel at once); without ``interval_s``, readings one after another, each stamped in
    ``t_ns`` (CLOCK_MONOTONIC ns, when its answer came)."""
    driver = _meter(services, meter)
    info = driver.info
    if info is None:
        raise HTTPException(503, f"{meter} has not been identified yet (offline)")
    channels = sorted(set(body.channels or range(1, info.channels + 1)))
    beyond = [c for c in channels if c > info.channels]
    if beyond:
        raise HTTPException(404, f"{meter} has channels 1..{info.channels}, not "
                                 f"{', '.join(map(str, beyond))}")
    if body.interval_s is not None:
        if not driver.supports_logging:
            raise RequestError(f"{meter} ({type(driver).driver}) has no logging function: "
                               "leave interval_s out for readings one after another")
        if body.points * body.interval_s > MAX_SERIES_S:
            raise RequestError(f"points * interval_s is {body.points * body.interval_s:g} s; "
                               f"a series may take at most {MAX_SERIES_S:g} s")
    else:
        took = body.points * sum(max(driver.window_s(c), 1e-3) for c in channels)
        if body.points > 1 and took > MAX_SERIES_S:
            raise RequestError(f"{body.points} readings of {len(channels)} channel(s) one "
                               f"after another take about {took:g} s; a request may take at "
                               f"most {MAX_SERIES_S:g} s (fewer points, or interval_s on a "
                               "meter that logs)")
    keys = {(f"meter:{meter}", c) for c in channels}
    async with services.engine.reservations.hold(keys):
        if body.interval_s is not None:
            return await _logged(driver, meter, channels, body.points, body.interval_s)
        return await _one_by_one(driver, meter, channels, body.points)


async def _logged(driver: PowerMeter, meter: str, channels: Sequence[int], points: int,
                  interval_s: float) -> dict[str, Any]:
    started = await driver.start_logging(list(channels), points, interval_s)
    series = {}
    for channel in channels:
        await driver.wait_logging(channel, timeout_s=points * interval_s + LOG_MARGIN_S)
        series[str(channel)] = _finite(await driver.fetch_log(channel))
    return {"meter": meter, "unit": "dBm", "start_ns": started, "interval_s": interval_s,
            "t_ns": None, "channels": series}


async def _one_by_one(driver: PowerMeter, meter: str, channels: Sequence[int], points: int
                      ) -> dict[str, Any]:
    series: dict[str, list[float | None]] = {str(c): [] for c in channels}
    stamps: list[int] = []
    started = time.monotonic_ns()
    for _ in range(points):
        for channel in channels:
            series[str(channel)].extend(_finite([await driver.read_power(channel)]))
        stamps.append(time.monotonic_ns())
    return {"meter": meter, "unit": "dBm", "start_ns": started, "interval_s": None,
            "t_ns": stamps, "channels": series}
