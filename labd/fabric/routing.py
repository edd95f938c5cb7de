"""Circuits between endpoints: routed over the ports no circuit uses, as hops per switch.

The engine makes or takes down the hops, one batch per switch; this module only works out
which hops, and says why a link has no free path before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from instruments.switch import OpticalSwitch, Pair
from labd.errors import PortBusy, UnknownPort
from labd.lab.loader import Lab
from labd.lab.wiring import CircuitRoute, route_circuit, trace_circuit

__all__ = ["busy_ports", "hops_to_break", "hops_to_make", "route"]


def busy_ports(intended: Mapping[str, Mapping[int, int]]) -> set[tuple[str, int]]:
    """Every (switch, port) an intended circuit uses."""
    return {(name, p) for name, pairs in intended.items()
            for pair in pairs.items() for p in pair}


def route(lab: Lab, switches: Mapping[str, OpticalSwitch], src: str, dst: str,
          busy: set[tuple[str, int]]) -> CircuitRoute:
    """A path from ``src`` to ``dst`` over ports not in ``busy``; PortBusy where every path
    crosses a busy port, UnknownPort where the cabling has none at all."""
    sizes = {name: (sw.info.ingress, sw.info.egress) for name, sw in switches.items()
             if sw.info is not None}
    found = route_circuit(lab, src, dst, sizes, busy)
    if found is not None:
        return found
    blocked = route_circuit(lab, src, dst, sizes)
    if blocked is not None:
        taken = sorted(f"{h.switch}:{p}" for h in blocked.hops for p in (h.ingress, h.egress)
                       if (h.switch, p) in busy)
        raise PortBusy(f"every path from {src!r} to {dst!r} crosses ports already in "
                       f"circuits (e.g. {', '.join(taken) or 'taken by this request'})")
    raise UnknownPort(f"no path from {src!r} to {dst!r} in the lab's cabling")


def hops_to_make(lab: Lab, switches: Mapping[str, OpticalSwitch],
                 intended: Mapping[str, Mapping[int, int]], links: list[tuple[str, str]]
                 ) -> tuple[list[CircuitRoute], dict[str, list[Pair]]]:
    """Every (sender, receiver) link routed over free ports (the links of one request
    never share a port), and the pairs each switch must make for them."""
    busy = busy_ports(intended)
    routes = []
    for src, dst in links:
        found = route(lab, switches, src, dst, busy)
        busy |= {(h.switch, p) for h in found.hops for p in (h.ingress, h.egress)}
        routes.append(found)
    per_switch: dict[str, list[Pair]] = {}
    for found in routes:
        for hop in found.hops:
            per_switch.setdefault(hop.switch, []).append((hop.ingress, hop.egress))
    return routes, per_switch


def hops_to_break(lab: Lab, intended: dict[str, dict[int, int]], src: str, dst: str
                  ) -> tuple[CircuitRoute, dict[str, list[int]]]:
    """The circuit from ``src`` to ``dst`` and the ingress ports each switch must free."""
    found = trace_circuit(lab, src, dst, intended)
    if found is None or not found.hops:
        raise UnknownPort(f"no circuit from {src!r} to {dst!r}")
    per_switch: dict[str, list[int]] = {}
    for hop in found.hops:
        per_switch.setdefault(hop.switch, []).append(hop.ingress)
    return found, per_switch
