"""``/v1/jobs``: the lab's jobs (members after any recovery, spares, epoch, status), their
circuits, starting and stopping them, returned spares and operators' decisions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from labd.daemon.api.bodies import DecisionBody, SpareBody
from labd.daemon.api.deps import ADMIN, ServicesDep
from labd.daemon.api.shapes import route_dict

router = APIRouter()


@router.get("/v1/jobs")
async def jobs(services: ServicesDep) -> list[dict[str, Any]]:
    """Every job: its current members (after any recovery), spares, epoch, status."""
    return [j.as_dict() for j in services.jobs.jobs.values()]


@router.get("/v1/jobs/{job}")
async def job_state(job: str, services: ServicesDep) -> dict[str, Any]:
    return services.jobs.job(job).as_dict()


@router.post("/v1/jobs/{job}/circuits", **ADMIN)
async def job_circuits(job: str, services: ServicesDep,
                       verify_light: bool = True) -> dict[str, Any]:
    """Make every circuit a job's topology needs (all routed before any is made)."""
    state = services.jobs.job(job)
    routes, results = await services.engine.connect_endpoints(
        state.entry.links(state.members), cause="api", verify_light=verify_light)
    return {"job": job, "routes": [route_dict(r) for r in routes],
            "reconfigurations": [r.as_dict() for r in results]}


@router.post("/v1/jobs/{job}/start", **ADMIN)
async def job_start(job: str, services: ServicesDep,
                    verify_light: bool = True) -> dict[str, Any]:
    """Make the job's missing circuits and start its ranks on the hosts' agents."""
    return await services.jobs.start_job(job, verify_light=verify_light)


@router.post("/v1/jobs/{job}/stop", **ADMIN)
async def job_stop(job: str, services: ServicesDep) -> dict[str, Any]:
    return await services.jobs.stop_job(job)


@router.post("/v1/jobs/{job}/spares", **ADMIN)
async def job_spare(job: str, body: SpareBody, services: ServicesDep) -> dict[str, Any]:
    """Return a repaired endpoint to the job's spare pool."""
    return await services.jobs.return_spare(job, body.endpoint)


@router.post("/v1/jobs/{job}/decision", **ADMIN)
async def job_decision(job: str, body: DecisionBody, services: ServicesDep) -> dict[str, Any]:
    """Approve or decline the swap a recovery proposes (recovery = "ask")."""
    return services.jobs.decide(job, body.approve)
