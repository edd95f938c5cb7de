"""``/v1/drills``: failover drills, where the lab's GPU hosts are emulated in the daemon's
process."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from labd.daemon.api.bodies import DrillBody
from labd.daemon.api.deps import ADMIN, ServicesDep

router = APIRouter()

#: Why a drill cannot run here: the one sentence the refusal and the read both give.
NO_DRILLS = ("failover drills need the lab's GPU hosts emulated by this daemon (labd run "
             "on a lab whose hosts are emulate = true, or labd demo --serve)")


@router.get("/v1/drills")
async def drills(services: ServicesDep) -> dict[str, Any]:
    """Which drills this daemon can run, and why not where it cannot: a client offers the
    drill only where it would be accepted, rather than asking and then being refused."""
    available = services.drills is not None
    return {"failover": {"available": available,
                         "reason": None if available else NO_DRILLS}}


@router.post("/v1/drills/failover", **ADMIN, status_code=202)
async def drill(body: DrillBody, services: ServicesDep) -> dict[str, Any]:
    """Start a failover drill (emulated GPU hosts only): fail a member, let the daemon
    recover the job, then repair the member and return it as a spare. Follow it by the
    ``drill`` and ``failover`` events."""
    if services.drills is None:
        raise HTTPException(409, NO_DRILLS)
    return services.drills.start(body.job, body.member, body.kind)
