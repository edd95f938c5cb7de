"""The reconfiguration engine: a request for circuits becomes the smallest change per switch,
run through the switch's driver as one batch, timed phase by phase, verified with light where
the lab has a meter on the path, recorded, and announced.

Phases (CLOCK_MONOTONIC ns): requested (the request arrived), dispatched (its ports were
free and the command left), acknowledged (the device said it is done), light verified (the
meters saw the light arrive or leave), done (all of it, before the record is written).
The intended state changes only when the device acknowledged: a failed request leaves it as
it was, and says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from instruments.errors import InstrumentError, InvalidRequest
from instruments.events import LinkState
from instruments.light import LightTimeout, LightWatch
from instruments.meter import PowerMeter
from instruments.switch import CheckedPairs, OpticalSwitch, Pair
from labd.errors import (
    NotLeader,
    PortBusy,
    StoreError,
    StoreUnavailable,
    Unavailable,
    UnknownSwitch,
)
from labd.events import EventHub
from labd.fabric import routing
from labd.fabric.dispatch import read_back, send, timed, undo
from labd.fabric.light import MAX_LOG_POINTS, Watches, log_resolution
from labd.fabric.planning import Change, checked, replacing, smallest
from labd.fabric.reservations import Reservations
from labd.lab.loader import Lab
from labd.lab.wiring import CircuitRoute, MeteredPath
from labd.store.writer import ReconfigurationRecord, Store

# MAX_LOG_POINTS and log_resolution live with light verification (labd.fabric.light) and
# are named here too, where the demo and the tests have always found them.
__all__ = ["MAX_LOG_POINTS", "Engine", "Leadership", "Result", "log_resolution"]


@dataclass
class Result:
    id: int
    switch: str
    cause: str
    outcome: str
    error: str | None
    connected: list[Pair]
    disconnected: list[Pair]
    phases: dict[str, int | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "switch": self.switch, "cause": self.cause,
                "outcome": self.outcome, "error": self.error,
                "connected": [list(p) for p in self.connected],
                "disconnected": [list(p) for p in self.disconnected], "phases": self.phases}


class Leadership(Protocol):
    """Whether this daemon leads its lab now (labd.ha: a lease held and renewed in time),
    and the refusal to give a request while it does not."""

    def holds(self) -> bool: ...

    def refusal(self) -> NotLeader: ...


class Engine:
    def __init__(self, lab: Lab, switches: Mapping[str, OpticalSwitch],
                 meters: Mapping[str, PowerMeter], store: Store, hub: EventHub, *,
                 light_window_s: float | None = None,
                 light_resolution_s: float = 1e-4) -> None:
        self.lab = lab
        self.switches = dict(switches)
        self.meters = dict(meters)
        self.store = store
        self.hub = hub
        self.watches = Watches(lab, self.switches, self.meters, store, hub,
                               window_s=light_window_s, resolution_s=light_resolution_s)
        """Light verification on the paths the lab's meters see."""
        self.intended: dict[str, dict[int, int]] = {name: {} for name in self.switches}
        self.reservations = Reservations()
        self._wholes: dict[str, frozenset[tuple[str, int]]] = {}
        self.leadership: Leadership | None = None
        """Set where several daemons share the lab (``--ha``): no command goes to a switch
        unless this daemon leads, checked as the request arrives and again just before the
        first byte is sent (a request that waited for its ports may have outlived the
        lease)."""

    @property
    def light_window_s(self) -> float | None:
        """Overrides the lab file's light windows (``light_window_ms``) when set."""
        return self.watches.window_override_s

    @light_window_s.setter
    def light_window_s(self, value: float | None) -> None:
        self.watches.window_override_s = value

    @property
    def light_resolution_s(self) -> float:
        """The finest sample time of a light-verification log."""
        return self.watches.resolution_s

    @light_resolution_s.setter
    def light_resolution_s(self, value: float) -> None:
        self.watches.resolution_s = value

    async def load_intended(self) -> None:
        stored = await self.store.intended()
        for name in self.switches:
            self.intended[name] = dict(stored.get(name, {}))

    # -- requests --------------------------------------------------------------------------
    def switch(self, name: str) -> OpticalSwitch:
        try:
            return self.switches[name]
        except KeyError:
            raise UnknownSwitch(f"no switch {name!r}; switches: "
                                f"{', '.join(sorted(self.switches)) or 'none'}") from None

    def check_leading(self) -> None:
        """Raise :class:`NotLeader` unless this daemon may command the lab's switches."""
        if self.leadership is not None and not self.leadership.holds():
            raise self.leadership.refusal()

    def online(self, name: str) -> OpticalSwitch:
        switch = self.switch(name)
        if switch.state is not LinkState.ONLINE or switch.info is None:
            raise Unavailable(f"{name} is {switch.state.value}; last error: "
                              f"{switch.connection.last_error or 'none'}")
        return switch

    def _whole(self, name: str, ports: int) -> frozenset[tuple[str, int]]:
        """The reservation keys of every port of a switch, made once per switch and size."""
        keys = self._wholes.get(name)
        if keys is None or len(keys) != ports:
            keys = self._wholes[name] = frozenset((name, p) for p in range(1, ports + 1))
        return keys

    def plan(self, name: str, *, connect: Iterable[Pair] | CheckedPairs = (),
             disconnect: Iterable[int] = (),
             replace: Iterable[Pair] | Mapping[int, int] | None = None,
             current: Mapping[int, int] | None = None) -> tuple[list[Pair], list[Pair]]:
        """(pairs to make, pairs to break) against the intended state (or ``current``, what
        the switch holds, for a restore); raises RequestError subclasses for anything
        wrong, before anything is touched."""
        switch = self.switch(name)
        intended = self.intended[name] if current is None else current
        if replace is not None:
            return replacing(intended, dict(checked(switch, replace).pairs))
        return smallest(name, switch, intended, checked(switch, connect), disconnect)

    def _plan(self, name: str, connect: CheckedPairs | None, disconnect: Iterable[int],
              target: dict[int, int] | None, current: Mapping[int, int] | None,
              ) -> tuple[list[Pair], list[Pair]]:
        """:meth:`plan`, with the pairs (or a whole-map ``target``) already checked."""
        if target is not None:
            return replacing(self.intended[name] if current is None else current, target)
        return self.plan(name, connect=connect or (), disconnect=disconnect)

    async def reconfigure(self, name: str, *, connect: Iterable[Pair] = (),
                          disconnect: Iterable[int] = (),
                          replace: Iterable[Pair] | Mapping[int, int] | None = None,
                          cause: str = "api",
                          verify_light: bool = True,
                          on_acknowledged: Callable[[str, int], None] | None = None,
                          from_device: bool = False) -> Result:
        """Carry out one request on one switch; returns once it is recorded.
        ``on_acknowledged(switch, ns)`` hears of the device's acknowledgement at once (light
        verification may take a while longer). ``from_device``: a whole-map replacement
        planned against what the switch holds rather than the intended state (a restore:
        its record names the circuits put back and taken away). ``replace``: the switch's
        whole map, as pairs (a port in two of them is refused, as in ``connect``) or as a
        mapping."""
        requested = time.monotonic_ns()
        change = self._request(name, connect, disconnect, replace, from_device, verify_light)
        phases: dict[str, int | None] = {"requested": requested, "dispatched": None,
                                         "activated": None, "acknowledged": None,
                                         "light": None, "done": None}
        async with self.reservations.hold(change.keys):
            self._replan(change)
            # A store that refused its last write refuses the request before the device
            # is touched (free while the store is well).
            await self.store.check_writable()
            self.check_leading()
            started = await self.watches.start(name, change.watched)
            outcome, error = await self._carry_out(change, started, phases, on_acknowledged)
            phases["done"] = time.monotonic_ns()
            row_id = await self._record(change, cause, requested, outcome, error, phases)
        await self.watches.keep_traces(started, row_id)
        result = Result(row_id, name, cause, outcome, error, change.make, change.brk, phases)
        self.hub.publish("reconfiguration", result.as_dict())
        return result

    def _request(self, name: str, connect: Iterable[Pair], disconnect: Iterable[int],
                 replace: Iterable[Pair] | Mapping[int, int] | None, from_device: bool,
                 verify_light: bool) -> Change:
        """The request checked and planned, before it waits for its ports: anything wrong
        with it is refused here, with nothing touched."""
        self.check_leading()
        switch = self.online(name)
        assert switch.info is not None
        current = dict(switch.expected) if from_device and replace is not None else None
        # Checked and put in canonical order once: the plans below, the driver's command and
        # the intended state that follows all read the same pairs, and the driver takes
        # them back without checking them again.
        whole = None if replace is None else checked(switch, replace)
        asked = None if whole is not None else checked(switch, connect)
        target = None if whole is None else dict(whole.pairs)
        make, brk = self._plan(name, asked, disconnect, target, current)
        # A whole-map replacement holds the whole switch; anything else, its ports (and, for
        # light verification, the meter channels on its paths).
        keys = (self._whole(name, switch.info.ports) if target is not None else
                frozenset((name, p) for pair in (*make, *brk) for p in pair))
        watched = self.watches.paths_for(name, make, brk) if verify_light else {}
        if watched:
            keys |= {(f"meter:{path.meter}", path.channel) for path, _ in watched.values()}
        return Change(name, switch, asked, disconnect, whole, target, current, verify_light,
                      make, brk, keys, watched)

    def _replan(self, change: Change) -> None:
        """Plan again under the reservation: a request ahead of this one may have moved
        things (a pair someone else made on its ports is now a 409, not a surprise)."""
        name = change.name
        if change.current is not None:
            # What the switch holds and what is intended, as they are now that the
            # switch is ours: a request that went ahead of the restore stands.
            change.current = dict(change.switch.expected)
            change.target = dict(self.intended[name])
            change.whole = None  # the intended state, which the driver checks as it sends it
        change.make, change.brk = self._plan(name, change.asked, change.disconnect,
                                             change.target, change.current)
        watched = (self.watches.paths_for(name, change.make, change.brk)
                   if change.verify_light else {})
        change.watched = {k: v for k, v in watched.items()
                          if (f"meter:{k[0]}", k[1]) in change.keys}

    async def _carry_out(self, change: Change, started: list[LightWatch],
                         phases: dict[str, int | None],
                         on_acknowledged: Callable[[str, int], None] | None,
                         ) -> tuple[str, str | None]:
        """Send the change, then wait for its light: (outcome, error)."""
        outcome, error = "ok", None
        try:
            await self._dispatch(change, phases, on_acknowledged)
        except InvalidRequest as exc:
            # The driver refused before sending anything (a mesh that would have to
            # move other circuits): a conflict for the caller, nothing to record.
            await self.watches.cancel(started)
            raise PortBusy(exc.message) from None
        except InstrumentError as exc:
            outcome, error = "failed", str(exc)
            error += await self._after_failure(change.name)
        if outcome == "ok" and started:
            try:
                phases["light"] = await self.watches.finish(started)
            except LightTimeout as exc:
                outcome, error = "light-missing", str(exc)
            except InstrumentError as exc:
                # The meter failed, not the light: the change stands, unverified.
                self.hub.publish("warning", {"detail": f"light verification on "
                                                       f"{change.name} failed: {exc}"})
        else:
            await self.watches.cancel(started)
        return outcome, error

    async def _dispatch(self, change: Change, phases: dict[str, int | None],
                        on_acknowledged: Callable[[str, int], None] | None) -> None:
        """Send the change to the switch; ``phases`` gains when it was dispatched,
        activated and acknowledged."""
        dispatched = phases["dispatched"] = time.monotonic_ns()
        wire = await send(change)
        dispatched, activated, acked = timed(wire, dispatched, time.monotonic_ns(),
                                             change.switch.done_on_reply)
        phases["dispatched"], phases["activated"] = dispatched, activated
        phases["acknowledged"] = acked
        if on_acknowledged is not None:
            on_acknowledged(change.name, acked)

    async def _record(self, change: Change, cause: str, requested: int, outcome: str,
                      error: str | None, phases: dict[str, int | None]) -> int:
        """The change taken as intended (unless it failed) and recorded: the record's id.
        Unrecorded is unacknowledged: a record the store refuses refuses the request, and
        the change is undone on the device so that it holds what the record says."""
        name = change.name
        previous = self.intended[name]
        if outcome != "failed":
            if change.target is not None:
                updated = dict(change.target)
            else:
                updated = dict(self.intended[name])
                for a, _ in change.brk:
                    updated.pop(a, None)
                updated.update(change.make)
            self.intended[name] = updated
        try:
            return await self.store.record(ReconfigurationRecord(
                switch=name, cause=cause, outcome=outcome, error=error, connected=change.make,
                disconnected=change.brk, requested_ns=requested,
                dispatched_ns=phases["dispatched"], activated_ns=phases["activated"],
                acked_ns=phases["acknowledged"], light_ns=phases["light"],
                done_ns=phases["done"] or time.monotonic_ns(),
                intended=dict(self.intended[name]) if change.target is not None else None,
                update_intended=outcome != "failed"))
        except StoreError as exc:
            self.intended[name] = previous
            undone = await self._undo(change) if outcome != "failed" else ""
            refusal = f"{name}: the change is refused, {exc}{undone}"
            self.hub.publish("warning", {"detail": refusal})
            raise StoreUnavailable(refusal) from None

    async def restore(self, name: str) -> Result:
        """Put the intended circuits back on a switch that lost or gained some (a restart,
        someone else's change): a whole-map replacement with cause ``restore``, timed and
        recorded like any other."""
        return await self.reconfigure(name, replace=self.intended[name], cause="restore",
                                      verify_light=False, from_device=True)

    async def adopt(self, name: str) -> Result:
        """Take what the switch holds as the intended state (a lab whose switches are also
        set by hand): nothing is sent; the record, cause ``adopt``, names the circuits the
        intended state gained and lost."""
        requested = time.monotonic_ns()
        self.check_leading()
        switch = self.online(name)
        assert switch.info is not None
        async with self.reservations.hold({(name, p) for p in range(1, switch.info.ports + 1)}):
            observed = dict(switch.expected)
            intended = self.intended[name]
            make = sorted((a, b) for a, b in observed.items() if intended.get(a) != b)
            brk = sorted((a, b) for a, b in intended.items() if observed.get(a) != b)
            await self.store.check_writable()
            done = time.monotonic_ns()
            try:
                row_id = await self.store.record(ReconfigurationRecord(
                    switch=name, cause="adopt", outcome="ok", error=None, connected=make,
                    disconnected=brk, requested_ns=requested, dispatched_ns=None,
                    activated_ns=None, acked_ns=None, light_ns=None, done_ns=done,
                    intended=observed, update_intended=True))
            except StoreError as exc:
                raise StoreUnavailable(f"{name}: the switch's map was not adopted, "
                                       f"{exc}") from None
            self.intended[name] = observed
        result = Result(row_id, name, "adopt", "ok", None, make, brk,
                        {"requested": requested, "dispatched": None, "activated": None,
                         "acknowledged": None, "light": None, "done": done})
        self.hub.publish("reconfiguration", result.as_dict())
        return result

    async def _undo(self, change: Change) -> str:
        """Put a switch back to its intended state after a change the store refused; says
        what became of the device."""
        if self.leadership is not None and not self.leadership.holds():
            # The refusal was the lease's: the switch is the new leader's to set right now.
            return "; the switch is left to the daemon that leads now"
        try:
            await undo(change.switch, self.intended[change.name], change.make, change.brk,
                       change.target is not None)
        except InstrumentError as exc:
            return (f"; the switch could not be put back ({exc})"
                    + await self._after_failure(change.name))
        return "; the switch was put back as it was"

    async def _after_failure(self, name: str) -> str:
        """After a failed command, ask the switch what it now holds: a half-applied change
        is reported (event and error text), never silently kept as intended."""
        return await read_back(name, self.switches[name], self.intended, self.hub)

    async def reconfigure_many(self, requests: Mapping[str, Mapping[int, int]], *,
                               cause: str = "api") -> list[Result]:
        """Whole target states for several switches, in parallel."""
        return list(await asyncio.gather(*(self.reconfigure(name, replace=target, cause=cause)
                                           for name, target in requests.items())))

    # -- circuits and jobs -----------------------------------------------------------------
    def busy_ports(self) -> set[tuple[str, int]]:
        return routing.busy_ports(self.intended)

    def route(self, src: str, dst: str, busy: set[tuple[str, int]]) -> CircuitRoute:
        return routing.route(self.lab, self.switches, src, dst, busy)

    async def connect_endpoints(self, links: list[tuple[str, str]], *, cause: str = "api",
                                verify_light: bool = True
                                ) -> tuple[list[CircuitRoute], list[Result]]:
        """Route every (sender, receiver) link over free ports (each may cross several
        switches), then make all the hops, one batch per switch, switches in parallel.
        Nothing is sent unless every link routes."""
        routes, per_switch = routing.hops_to_make(self.lab, self.switches, self.intended, links)
        results = await asyncio.gather(*(
            self.reconfigure(name, connect=pairs, cause=cause, verify_light=verify_light)
            for name, pairs in per_switch.items()))
        return routes, list(results)

    async def disconnect_endpoints(self, src: str, dst: str, *, cause: str = "api",
                                   verify_light: bool = True
                                   ) -> tuple[CircuitRoute, list[Result]]:
        """Take down the circuit from ``src`` to ``dst``: every hop it uses, switches in
        parallel."""
        route, per_switch = routing.hops_to_break(self.lab, self.intended, src, dst)
        results = await asyncio.gather(*(
            self.reconfigure(name, disconnect=ports, cause=cause, verify_light=verify_light)
            for name, ports in per_switch.items()))
        return route, list(results)

    # -- light -----------------------------------------------------------------------------
    def metered(self, switch: str) -> list[MeteredPath]:
        """The paths through ``switch`` whose light a meter sees (light verification)."""
        return self.watches.metered(switch)

    def window_s(self, switch: str) -> float:
        """How long light verification waits after a change on ``switch``."""
        return self.watches.window_s(switch)
