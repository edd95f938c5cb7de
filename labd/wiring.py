"""Questions about how a lab is cabled, answered from its lab file."""

from __future__ import annotations

from dataclasses import dataclass

from labd.labfile import Lab


@dataclass(frozen=True)
class MeteredPath:
    """Light launched into ``switch:ingress`` that leaves through ``switch:egress`` reaches
    meter channel ``meter:channel`` (directly or through a tap)."""

    switch: str
    ingress: int
    egress: int
    meter: str
    channel: int


def _node(text: str) -> tuple[str, int] | None:
    owner, sep, number = text.partition(":")
    return (owner, int(number)) if sep and number.isdigit() else None


def metered_paths(lab: Lab, switch: str) -> list[MeteredPath]:
    """One-hop paths through ``switch`` from a transmitting endpoint to a meter channel."""
    lit = {e.id for e in lab.endpoint if e.launch_dbm is not None}
    ingress = sorted(n[1] for f in lab.fiber if f.src in lit
                     if (n := _node(f.dst)) is not None and n[0] == switch)
    paths = []
    for fiber in lab.fiber:
        out = _node(fiber.src)
        if out is None or out[0] != switch:
            continue
        meter = _node(fiber.tap) if fiber.tap else _node(fiber.dst)
        if meter is None or meter[0] == switch:
            continue
        for port in ingress:
            if port != out[1]:
                paths.append(MeteredPath(switch, port, out[1], meter[0], meter[1]))
    return paths


def dark_ingress(lab: Lab, switch: str, ingress_ports: int) -> int | None:
    """An ingress port of ``switch`` that no transmitting endpoint lights, if any."""
    lit = {e.id for e in lab.endpoint if e.launch_dbm is not None}
    fed = {n[1] for f in lab.fiber if f.src in lit
           if (n := _node(f.dst)) is not None and n[0] == switch}
    return next((p for p in range(ingress_ports, 0, -1) if p not in fed), None)


@dataclass(frozen=True)
class CircuitRoute:
    """Light from endpoint ``src`` enters ``switch`` at ``ingress`` and leaves at ``egress``
    towards endpoint ``dst``."""

    src: str
    dst: str
    switch: str
    ingress: int
    egress: int


def route_circuit(lab: Lab, src: str, dst: str, switches: set[str]) -> CircuitRoute | None:
    """The one-switch path from ``src`` to ``dst`` the cabling allows, if any."""
    into = [n for f in lab.fiber if f.src == src
            if (n := _node(f.dst)) is not None and n[0] in switches]
    out_of = [n for f in lab.fiber if f.dst == dst
              if (n := _node(f.src)) is not None and n[0] in switches]
    for switch, ingress in into:
        for other, egress in out_of:
            if other == switch and egress != ingress:
                return CircuitRoute(src, dst, switch, ingress, egress)
    return None
