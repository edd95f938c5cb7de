"""What is done when a switch holds other circuits than the intended ones.

At start-up, whenever a switch comes back online (a reconnect, a restart found by the
liveness watch) and whenever its map audit (``audit_interval_s``) finds a change another
controller made while it was idle, its map is compared with the intended state. Each
switch's ``on_drift`` (lab file) then says what happens: ``restore`` puts the intended
circuits back, ``report`` only announces the drift, ``adopt`` takes the switch's map as
the intended one.
``restore=False`` (``labd run --no-restore``) makes every switch ``report``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from instruments.events import Drift, InstrumentEvent, LinkState
from instruments.instrument import Instrument
from labd.errors import LabdError
from labd.events import EventHub
from labd.fabric.engine import Engine

__all__ = ["DriftPolicy", "StartupReport", "drift_data", "identity_line", "open_instruments"]

log = logging.getLogger(__name__)


@dataclass
class StartupReport:
    """What start-up (or a takeover) found: instruments connected and failed, drift, and
    what was done about it."""

    connected: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    drift: dict[str, Drift] = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)


async def open_instruments(drivers: Mapping[str, Instrument],
                           wait_s: float | None = None) -> StartupReport:
    """Every instrument at once; each that failed keeps reconnecting by itself. With
    ``wait_s``, one still opening then is reported so and left to finish on its own (it is
    dealt with when it comes online): a takeover must not wait out a stalled device's
    reply timeout (5 s) with the lab leaderless."""
    report = StartupReport()
    opening = {name: asyncio.ensure_future(d.connection.open_or_retry())
               for name, d in drivers.items()}
    try:
        if opening:
            await asyncio.wait(opening.values(), timeout=wait_s)
    except BaseException:  # cancelled (the daemon stopping): the opens go with the wait
        for task in opening.values():
            task.cancel()
        raise
    for name, task in opening.items():
        if not task.done():  # held first, whatever the others' results raise below
            _STILL_OPENING.add(task)
            task.add_done_callback(_opened)
            report.failed[name] = (f"still opening after {wait_s:g} s; dealt with when it "
                                   "comes online")
    for name, task in opening.items():
        if name in report.failed:
            continue
        if (error := task.result()) is None:
            report.connected[name] = identity_line(drivers[name])
        else:
            report.failed[name] = str(error)
    return report


def identity_line(driver: Instrument) -> str:
    """What an instrument said it is, for the start-up line: vendor and model, and the
    identity fields it did not give with why (the warning of a refused optional query,
    or that the device reported none)."""
    info = getattr(driver, "info", None)
    if info is None:
        return "ok"
    said = " ".join(str(getattr(info, key, "")) for key in ("vendor", "model")
                    if getattr(info, key, "")) or "identified"
    missing = [key for key in ("model", "serial", "firmware")
               if hasattr(info, key) and not getattr(info, key)]
    warnings = "; ".join(driver.warnings)
    if missing:
        named = missing[0] if len(missing) == 1 else \
            ", ".join(missing[:-1]) + f" or {missing[-1]}"
        return f"{said} (no {named}: {warnings or 'the device reported none'})"
    return f"{said} ({warnings})" if warnings else said


_STILL_OPENING: set[asyncio.Future[Any]] = set()
"""Opens a takeover stopped waiting for, held until they end (the loop keeps only weak
references to tasks). Each ends by itself: connected, or failed into its own backoff, or
closed with its instrument at the daemon's stop."""


def _opened(task: asyncio.Future[Any]) -> None:
    _STILL_OPENING.discard(task)
    if not task.cancelled():
        task.exception()  # told by the instrument's own state events, not as "never retrieved"


def drift_data(drift: Drift) -> dict[str, list[list[int]]]:
    return {"missing": [[a, b] for a, b in sorted(drift.missing.items())],
            "unexpected": [[a, b] for a, b in sorted(drift.unexpected.items())]}


class DriftPolicy:
    """The switches of ``engine`` against its intended state, each dealt with as its
    ``on_drift`` says (``policies``: switch → restore, report or adopt); drift and what
    failed are published on ``hub``."""

    def __init__(self, engine: Engine, hub: EventHub, policies: Mapping[str, str], *,
                 restore: bool = True) -> None:
        self.engine, self.hub = engine, hub
        self.policies = dict(policies)
        self.restore = restore
        self.restarted: dict[str, str] = {}
        """Per switch, why its latest reconnect looked like a restart (for the drift
        event)."""
        self._reconciled = False
        self._healing: dict[str, asyncio.Task[None]] = {}
        self._heal_again: dict[str, str] = {}
        """Switches to look at again when their heal ends, and what found them."""

    def on_drift(self, switch: str) -> str:
        """What is done when ``switch`` holds other circuits than intended: the lab file's
        ``on_drift``, or ``report`` for every switch under ``--no-restore``."""
        return self.policies.get(switch, "restore") if self.restore else "report"

    def heard(self, event: InstrumentEvent) -> None:
        """An instrument's event as the daemon publishes it (``instrument.<kind>``),
        published: a reconnect that looks like a restart is noted for the drift event to
        come, and a switch back online is dealt with (:meth:`came_online`)."""
        data: dict[str, Any] = {"instrument": event.instrument, "kind": event.kind,
                                "state": event.state.value if event.state else None,
                                "detail": event.detail}
        if event.drift is not None:
            data["drift"] = drift_data(event.drift)
        if event.data.get("restarted"):
            data["restarted"] = self.restarted[event.instrument] = event.data["restarted"]
        if event.data.get("audit"):
            data["audit"] = True
        self.hub.publish(f"instrument.{event.kind}", data)
        if event.kind == "state" and event.state is LinkState.ONLINE:
            self.came_online(event.instrument)
        elif event.kind == "drift" and event.data.get("audit"):
            self.audited(event.instrument)

    def audited(self, switch: str) -> None:
        """A switch's map audit (``audit_interval_s``) found other circuits than expected:
        someone else changed it while it was idle. Dealt with as a reconnect is, once
        start-up has reconciled."""
        if self._reconciled and switch in self.engine.switches:
            self._heal_soon(switch, "audit")

    def came_online(self, switch: str) -> None:
        """A switch is online again: dealt with once start-up has reconciled (before, the
        start-up's own pass finds it)."""
        if self._reconciled and switch in self.engine.switches:
            self._heal_soon(switch)

    async def reconcile(self, report: StartupReport) -> None:
        """The switches' circuits against the intended state, each dealt with as its
        ``on_drift`` says; from here on, so is every switch that comes back online (one
        that failed at start-up included)."""
        await self.engine.load_intended()
        self._reconciled = True
        for name, switch in self.engine.switches.items():
            if switch.state is not LinkState.ONLINE:
                continue  # dealt with when it comes online
            running = self._healing.get(name)
            if running is not None and not running.done():
                continue  # it came online during this pass (a takeover's late open): in hand
            # As a heal, one at a time per switch: a reconnect meanwhile is looked at after.
            task = self._healing[name] = asyncio.get_running_loop().create_task(
                self._heal(name, report), name=f"labd-heal-{name}")
            await task

    async def settle(self, switch: str, report: StartupReport | None = None,
                     when: str = "reconnect") -> None:
        """The switch's map against the intended state, dealt with as ``on_drift`` says;
        ``when`` (``reconnect`` or ``audit``) is what found it, after start-up."""
        drift = Drift.between(self.engine.intended[switch],
                              self.engine.switches[switch].expected)
        restarted = self.restarted.pop(switch, None)
        if not drift:
            return
        policy = self.on_drift(switch)
        data: dict[str, Any] = {"switch": switch, **drift_data(drift), "policy": policy,
                                "restarted": restarted,
                                "when": "start-up" if report is not None else when}
        self.hub.publish("drift", data)
        if report is not None:
            report.drift[switch] = drift
        if policy == "restore":
            await self.engine.restore(switch)
            if report is not None:
                report.restored.append(switch)
        elif policy == "adopt":
            await self.engine.adopt(switch)
            if report is not None:
                report.adopted.append(switch)

    def take_tasks(self) -> list[asyncio.Task[None]]:
        """The heals under way, handed to whoever stops them (none start after)."""
        tasks, self._healing = list(self._healing.values()), {}
        return tasks

    def _heal_soon(self, switch: str, when: str = "reconnect") -> None:
        """Compare a switch that came back online with the intended state, in a task of its
        own (the event came from inside its connection). One at a time per switch: a
        reconnect during a heal is looked at again when it ends."""
        running = self._healing.get(switch)
        if running is not None and not running.done():
            self._heal_again[switch] = when
            return
        self._healing[switch] = asyncio.get_running_loop().create_task(
            self._heal(switch, when=when), name=f"labd-heal-{switch}")

    async def _heal(self, switch: str, report: StartupReport | None = None,
                    when: str = "reconnect") -> None:
        while True:
            self._heal_again.pop(switch, None)
            found = "at start-up" if report is not None else \
                "by the map audit" if when == "audit" else "on reconnecting"
            try:
                await self.settle(switch, report, when)
            except LabdError as exc:
                # Offline again, the store refusing: the next reconnect tries again.
                self.hub.publish("warning", {"detail": f"{switch}: the drift found {found} "
                                                       f"was not dealt with: {exc}"})
            except Exception:
                log.exception("%s: dealing with drift failed", switch,
                              extra={"instrument": switch})
            if switch not in self._heal_again:
                return
            report, when = None, self._heal_again[switch]  # looked at again
