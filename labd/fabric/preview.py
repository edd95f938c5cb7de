"""What a circuit between two endpoints would take, asked before it is made: the hops the
engine would route it over, or why it cannot be made now and which circuits stand in its
way. Read-only: it reads the lab's cabling and the intended state, and touches no device.

A circuit is routed over free ports only (Engine.connect_endpoints), so making one never
displaces another: where every path is taken, the request is refused, and the plan names
what holds the ports of the shortest cabled path."""

from __future__ import annotations

from dataclasses import dataclass

from instruments.events import LinkState
from labd.errors import RequestError, UnknownPort
from labd.fabric.engine import Engine
from labd.lab.loader import Lab
from labd.lab.wiring import CircuitRoute, circuits, route_circuit, trace_circuit


@dataclass(frozen=True)
class Holder:
    """A port on the way that is already taken: its pair's other port, and the circuit
    between endpoints that the pair belongs to (None for a raw pair)."""

    switch: str
    port: int
    partner: int
    circuit: CircuitRoute | None


@dataclass(frozen=True)
class CircuitPlan:
    """The answer to "what would connecting ``src`` to ``dst`` do now?"."""

    src: str
    dst: str
    route: CircuitRoute | None
    """The hops the engine would make; None where it would refuse."""
    existing: CircuitRoute | None
    """The circuit from ``src`` to ``dst`` that is already up, if one is."""
    in_the_way: tuple[Holder, ...]
    """Where no free path exists: the taken ports of the shortest cabled path."""
    offline: tuple[str, ...]
    """Switches on the route that are not online now (the request would be refused)."""
    reason: str | None
    """Why the circuit cannot be made now; None where it can."""

    @property
    def possible(self) -> bool:
        return self.reason is None


def check_endpoints(lab: Lab, src: str, dst: str) -> None:
    """Refuse, naming the field, an endpoint the lab does not have, or a circuit from an
    endpoint to itself."""
    known = [e.id for e in lab.endpoint]
    for field, value in (("from", src), ("to", dst)):
        if value not in known:
            shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            raise UnknownPort(f"{field}: no endpoint {value!r} in the lab (endpoints: "
                              f"{shown or 'none'})")
    if src == dst:
        raise RequestError(f"to: {dst!r} is the same endpoint as from")


def plan_circuit(lab: Lab, src: str, dst: str, sizes: dict[str, tuple[int, int]],
                 intended: dict[str, dict[int, int]], online: set[str],
                 unidentified: set[str] | None = None) -> CircuitPlan:
    """The plan for a circuit from ``src`` to ``dst``: ``sizes`` each identified switch's
    (ingress, egress) counts, ``intended`` their pairs, ``online`` the switches that take
    commands now, ``unidentified`` those not yet known (their ports route nothing). The
    route is the one Engine.route would choose from the same state."""
    check_endpoints(lab, src, dst)
    busy = {(name, p) for name, pairs in intended.items()
            for pair in pairs.items() for p in pair}
    existing = trace_circuit(lab, src, dst, intended)
    route = route_circuit(lab, src, dst, sizes, busy)
    if route is not None:
        offline = tuple(sorted({h.switch for h in route.hops} - online))
        reason = (f"{', '.join(offline)} {'is' if len(offline) == 1 else 'are'} not online"
                  if offline else None)
        return CircuitPlan(src, dst, route, existing, (), offline, reason)
    cabled = route_circuit(lab, src, dst, sizes)
    if cabled is None:
        unknown = sorted(unidentified or ())
        # An offline switch's size is not known yet: a path through it cannot be told.
        beyond = (f" over the switches identified so far (not yet: {', '.join(unknown)})"
                  if unknown else "")
        return CircuitPlan(src, dst, None, existing, (), tuple(unknown),
                           f"no path from {src!r} to {dst!r} in the lab's cabling{beyond}")
    through = {(h.switch, p): c for c in circuits(lab, intended)
               for h in c.hops for p in (h.ingress, h.egress)}
    partners = {name: {**pairs, **{b: a for a, b in pairs.items()}}
                for name, pairs in intended.items()}
    holders = tuple(Holder(h.switch, p, partners[h.switch][p], through.get((h.switch, p)))
                    for h in cabled.hops for p in (h.ingress, h.egress)
                    if (h.switch, p) in busy)
    if existing is not None:
        reason = "the circuit is already up"
    else:
        reason = f"every path from {src!r} to {dst!r} crosses ports already in circuits"
    return CircuitPlan(src, dst, None, existing, holders, (), reason)


def plan_on(engine: Engine, src: str, dst: str) -> CircuitPlan:
    """:func:`plan_circuit` on the engine's lab and state, as its connect would see them."""
    sizes = {name: (sw.info.ingress, sw.info.egress) for name, sw in engine.switches.items()
             if sw.info is not None}
    online = {name for name, sw in engine.switches.items()
              if sw.state is LinkState.ONLINE and sw.info is not None}
    return plan_circuit(engine.lab, src, dst, sizes, engine.intended, online,
                        set(engine.switches) - set(sizes))
