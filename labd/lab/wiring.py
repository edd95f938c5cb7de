"""Questions about how a lab is cabled, answered from its lab file."""

from __future__ import annotations

from dataclasses import dataclass

from labd.lab.loader import Lab


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
class Hop:
    """Light enters ``switch`` at ``ingress`` and leaves at ``egress``."""

    switch: str
    ingress: int
    egress: int


@dataclass(frozen=True)
class CircuitRoute:
    """The switch hops that carry light from endpoint ``src`` to endpoint ``dst``."""

    src: str
    dst: str
    hops: tuple[Hop, ...]


def route_circuit(lab: Lab, src: str, dst: str, switches: dict[str, tuple[int, int]],
                  busy: set[tuple[str, int]] | None = None) -> CircuitRoute | None:
    """The shortest path (fewest switches) from ``src`` to ``dst`` that the cabling allows,
    through ports not in ``busy``. ``switches`` gives each switch's (ingress, egress)
    counts: on an NxM switch light goes from an ingress port to an egress port; on an
    any-to-any switch (egress 0) between any two ports."""
    busy = busy or set()
    out_fibres: dict[str, list[str]] = {}
    for fibre in lab.fiber:
        out_fibres.setdefault(fibre.src, []).append(fibre.dst)
    by_switch: dict[str, list[int]] = {}
    for fibre in lab.fiber:
        port = _node(fibre.src)
        if port is not None and port[0] in switches:
            by_switch.setdefault(port[0], []).append(port[1])
    frontier: list[tuple[str, tuple[Hop, ...]]] = [(src, ())]
    seen = {src}
    while frontier:
        following: list[tuple[str, tuple[Hop, ...]]] = []
        for node, hops in frontier:
            for nxt in out_fibres.get(node, []):
                if nxt == dst:
                    return CircuitRoute(src, dst, hops)
                where = _node(nxt)
                if where is None or where[0] not in switches or nxt in seen:
                    continue
                switch, ingress = where
                if (switch, ingress) in busy:
                    continue
                n, m = switches[switch]
                for egress in by_switch.get(switch, []):
                    if egress == ingress or (switch, egress) in busy:
                        continue
                    if m and not (ingress <= n < egress):
                        continue
                    leaving = f"{switch}:{egress}"
                    if leaving not in seen:
                        seen.add(leaving)
                        following.append((leaving, (*hops, Hop(switch, ingress, egress))))
                seen.add(nxt)
        frontier = following
    return None


def trace_from(lab: Lab, src: str, intended: dict[str, dict[int, int]]) -> CircuitRoute | None:
    """Where light from endpoint ``src`` goes: follow the fibres and the switches' intended
    pairs (either direction of a pair) to the endpoint it reaches; None when it reaches no
    endpoint through at least one switch."""
    endpoints = {e.id for e in lab.endpoint}
    out_fibres: dict[str, list[str]] = {}
    for fibre in lab.fiber:
        out_fibres.setdefault(fibre.src, []).append(fibre.dst)
    partners = {name: {**pairs, **{b: a for a, b in pairs.items()}}
                for name, pairs in intended.items()}
    hops: list[Hop] = []
    node, seen = src, {src}
    while True:
        nexts = out_fibres.get(node, [])
        reached = [n for n in nexts if n in endpoints and n != src]
        if reached and hops:
            return CircuitRoute(src, reached[0], tuple(hops))
        step = None
        for nxt in nexts:
            where = _node(nxt)
            if where is not None and where[1] in partners.get(where[0], {}):
                step = where
                break
        if step is None:
            return None
        switch, ingress = step
        egress = partners[switch][ingress]
        hops.append(Hop(switch, ingress, egress))
        node = f"{switch}:{egress}"
        if node in seen:
            return None
        seen.add(node)


def trace_circuit(lab: Lab, src: str, dst: str,
                  intended: dict[str, dict[int, int]]) -> CircuitRoute | None:
    """The hops an existing circuit takes from ``src`` to ``dst``, if it exists."""
    route = trace_from(lab, src, intended)
    return route if route is not None and route.dst == dst else None


def circuits(lab: Lab, intended: dict[str, dict[int, int]]) -> list[CircuitRoute]:
    """Every circuit the switches' intended pairs make between endpoints."""
    return [route for e in lab.endpoint
            if (route := trace_from(lab, e.id, intended)) is not None]
