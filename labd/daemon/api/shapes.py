"""How the record's rows and the lab's routes look in the API's answers (JSON-ready
dicts). Each is called while the store's session is still open: a reconfiguration's pair
changes are loaded on first use."""

from __future__ import annotations

from typing import Any

import numpy as np

from labd.fabric.preview import CircuitPlan
from labd.hosts.jobs import since_failure_ms
from labd.lab.loader import EndpointEntry
from labd.lab.wiring import CircuitRoute
from labd.store.models import FailoverTimeline, PowerTrace, Reconfiguration


def route_dict(route: CircuitRoute) -> dict[str, Any]:
    return {"from": route.src, "to": route.dst,
            "hops": [{"switch": h.switch, "ingress": h.ingress, "egress": h.egress}
                     for h in route.hops]}


def phases_dict(row: Reconfiguration) -> dict[str, int | None]:
    """The reconfiguration's phases (labd.vocabulary.PHASES), each in ns or None."""
    return {"requested": row.requested_ns, "dispatched": row.dispatched_ns,
            "activated": row.activated_ns, "acknowledged": row.acked_ns,
            "light": row.light_ns, "done": row.done_ns}


def reconfiguration_dict(row: Reconfiguration) -> dict[str, Any]:
    return {
        "id": row.id, "switch": row.switch, "cause": row.cause, "outcome": row.outcome,
        "error": row.error, "batch_size": row.batch_size,
        "wall_time": row.wall_time.isoformat(), "phases": phases_dict(row),
        "connected": [[c.a, c.b] for c in row.changes if c.action == "connect"],
        "disconnected": [[c.a, c.b] for c in row.changes if c.action == "disconnect"],
    }


def trace_dict(trace: PowerTrace) -> dict[str, Any]:
    """A power trace with its samples in dBm, to the thousandth."""
    return {"meter": trace.meter, "channel": trace.channel, "start_ns": trace.start_ns,
            "atime_s": trace.atime_s,
            "dbm": [round(float(v), 3) for v in np.frombuffer(trace.dbm, dtype="<f4")]}


def failover_dict(row: FailoverTimeline) -> dict[str, Any]:
    stages = dict(row.stages)
    return {"id": row.id, "job": row.job, "outcome": row.outcome, "trigger": row.trigger,
            "wall_time": row.wall_time.isoformat(), "stages": stages,
            "since_failure_ms": since_failure_ms(stages),
            **{k: v for k, v in (row.detail or {}).items() if k != "trigger"}}


def plan_dict(plan: CircuitPlan) -> dict[str, Any]:
    """A circuit's plan (labd.fabric.preview) as ``GET /v1/circuits/plan`` gives it."""
    return {"from": plan.src, "to": plan.dst, "possible": plan.possible,
            "route": None if plan.route is None else route_dict(plan.route),
            "existing": None if plan.existing is None else route_dict(plan.existing),
            "in_the_way": [{"switch": h.switch, "port": h.port, "partner": h.partner,
                            "circuit": None if h.circuit is None else route_dict(h.circuit)}
                           for h in plan.in_the_way],
            "offline": list(plan.offline), "reason": plan.reason}


def endpoint_dict(entry: EndpointEntry, host: str | None, circuit: CircuitRoute | None
                  ) -> dict[str, Any]:
    """An endpoint as ``GET /v1/endpoints`` gives it: what it launches, the host whose NIC
    it is, and the circuit it is an end of now."""
    return {"id": entry.id, "launch_dbm": entry.launch_dbm,
            "wavelength_nm": entry.wavelength_nm, "host": host,
            "circuit": None if circuit is None else route_dict(circuit)}
