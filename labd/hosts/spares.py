"""Choosing a spare for a failed job member and planning the rewiring: which circuits go,
which are made (routed over free ports), and what each switch must hold afterwards.

A spare qualifies when its host is online, its GPU is healthy, it belongs to no running
job, and every circuit it needs routes through the fabric. Among those, the fewest switch
hops wins, then the failed member's rack, then the order of the job's ``spares``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labd.errors import RequestError
from labd.fabric.engine import Engine
from labd.lab.loader import JobEntry, Lab
from labd.lab.wiring import CircuitRoute, trace_circuit


@dataclass(frozen=True)
class Replacement:
    failed: str
    spare: str
    members: list[str]
    """The job's members after the swap, in rank order (the spare takes the failed rank)."""
    broken: list[CircuitRoute]
    made: list[CircuitRoute]
    targets: dict[str, dict[int, int]]
    """Every switch that changes, and the whole map it must hold afterwards."""
    hops: int
    same_rack: bool

    def describe(self) -> dict[str, object]:
        return {"failed": self.failed, "spare": self.spare, "members": self.members,
                "hops": self.hops, "same_rack": self.same_rack,
                "broken": [_route_text(r) for r in self.broken],
                "made": [_route_text(r) for r in self.made],
                "new_links": [[r.src, r.dst] for r in self.made]}


def _route_text(route: CircuitRoute) -> str:
    hops = " ".join(f"{h.switch}:{h.ingress}>{h.egress}" for h in route.hops)
    return f"{route.src} -> {route.dst} via {hops or 'a direct fibre'}"


def _ports(route: CircuitRoute) -> set[tuple[str, int]]:
    return {(h.switch, p) for h in route.hops for p in (h.ingress, h.egress)}


def plan_replacement(lab: Lab, engine: Engine, job: JobEntry, members: list[str], failed: str,
                     spare: str) -> Replacement:
    """The rewiring that puts ``spare`` in ``failed``'s place; raises RequestError (naming
    the link) when a new circuit has no free path."""
    new_members = [spare if m == failed else m for m in members]
    before, after = job.links(members), job.links(new_members)
    broken = [route for src, dst in before if (src, dst) not in after
              if (route := trace_circuit(lab, src, dst, engine.intended)) is not None]
    freed = set().union(*(_ports(r) for r in broken)) if broken else set()
    busy = engine.busy_ports() - freed
    made = []
    for src, dst in after:
        if (src, dst) in before:
            continue
        route = engine.route(src, dst, busy)
        busy |= _ports(route)
        made.append(route)
    targets: dict[str, dict[int, int]] = {}
    for route in broken:
        for hop in route.hops:
            pairs = targets.setdefault(hop.switch, dict(engine.intended[hop.switch]))
            for a in [a for a, b in pairs.items() if {a, b} == {hop.ingress, hop.egress}]:
                del pairs[a]
    for route in made:
        for hop in route.hops:
            targets.setdefault(hop.switch, dict(engine.intended[hop.switch]))[
                hop.ingress] = hop.egress
    where_failed, where_spare = lab.placement(failed), lab.placement(spare)
    same_rack = (where_failed is not None and where_spare is not None
                 and bool(where_failed[0].rack) and where_failed[0].rack == where_spare[0].rack)
    return Replacement(failed, spare, new_members, broken, made, targets,
                       sum(len(r.hops) for r in made), same_rack)


def choose_spare(lab: Lab, engine: Engine, job: JobEntry, members: list[str], failed: str,
                 spares: list[str], unusable: Callable[[str], str | None]
                 ) -> tuple[Replacement | None, dict[str, str]]:
    """The best replacement for ``failed``, and why each other spare was passed over.
    ``unusable(endpoint)`` says why a spare cannot serve (unhealthy, taken), or None."""
    rejected: dict[str, str] = {}
    plans = []
    for order, spare in enumerate(spares):
        why = unusable(spare)
        if why is not None:
            rejected[spare] = why
            continue
        try:
            plan = plan_replacement(lab, engine, job, members, failed, spare)
        except RequestError as exc:
            rejected[spare] = f"not reachable: {exc}"
            continue
        plans.append(((plan.hops, not plan.same_rack, order), plan))
    if not plans:
        return None, rejected
    plans.sort(key=lambda item: item[0])
    best = plans[0][1]
    for _, other in plans[1:]:
        rejected[other.spare] = (f"passed over: {other.hops} switch hops"
                                 + ("" if other.same_rack else ", another rack"))
    return best, rejected
