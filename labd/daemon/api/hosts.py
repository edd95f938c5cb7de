"""``/v1/hosts``: the GPU hosts as their agents report them; and ``/v1/agents``, the way
agents reach the daemon where the lab has no MQTT broker (their messages in, job commands
out by long poll)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel, ConfigDict

from labd.daemon.api.deps import AGENT, ServicesDep

router = APIRouter()

#: The most hosts one page of ``GET /v1/hosts`` may hold.
MAX_PAGE = 10_000


class GpuView(BaseModel):
    """One GPU as its host's agent last reported it (and whatever else the agent said)."""

    model_config = ConfigDict(extra="allow")
    index: int
    health: Literal["healthy", "degraded", "failed"]


class HostView(BaseModel):
    """A host as ``GET /v1/hosts`` gives it."""

    id: str
    status: Literal["online", "offline", "lost", "unknown"]
    last_beat_ns: int | None
    """When its last heartbeat arrived (the daemon's CLOCK_MONOTONIC)."""
    interval_s: float | None
    gpus: list[GpuView]
    nics: dict[str, bool]
    error: str | None


@router.get("/v1/hosts", response_model=list[HostView], responses={404: {
    "description": "``after`` names a host the lab does not have",
    "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": {"type": "string"}},
        "required": ["detail"]}}}}})
async def hosts(services: ServicesDep,
                status: Annotated[Literal["online", "offline", "lost", "unknown"] | None,
                                  Query(description="only hosts with this status")] = None,
                after: Annotated[str | None, Query(
                    max_length=64, description="start after this host (the last id of the "
                                               "page before)")] = None,
                limit: Annotated[int | None, Query(ge=1, le=MAX_PAGE, description=(
                    "at most this many hosts"))] = None) -> Response:
    """GPU hosts as their agents report them (status, heartbeat, each GPU's health), in
    lab-file order; ``status``, ``after`` and ``limit`` page through them (the next page
    starts after the last id of this one; a page shorter than ``limit`` is the last)."""
    monitor = services.hosts
    if after is not None and after not in monitor.hosts:
        raise HTTPException(404, f"after: no host {after!r} in the lab file")
    # Each host's JSON is kept between changes (labd.hosts.monitor): no serialisation of
    # the fleet here, and no validation of what the monitor has already checked.
    chosen = None if status is None and after is None and limit is None else \
        monitor.select(status, after, limit)
    return Response(monitor.as_json(chosen), media_type="application/json")


@router.post("/v1/agents/{host}/{kind}", **AGENT, status_code=202)
async def agent_message(host: str, kind: str, request: Request,
                        services: ServicesDep) -> dict[str, Any]:
    """An agent's message where the lab has no broker: ``status``, ``heartbeat`` or
    ``events``, with the same payloads as on MQTT."""
    if kind not in ("status", "heartbeat", "events"):
        raise HTTPException(404, f"no agent message kind {kind!r}; expected status, "
                                 "heartbeat or events")
    monitor = services.hosts
    if host not in monitor.hosts:
        raise HTTPException(404, f"no host {host!r} in the lab file; hosts: "
                                 f"{', '.join(monitor.hosts) or 'none'}")
    problem = monitor.handle(host, kind, await request.body())
    if problem is not None:
        raise HTTPException(422, problem)
    return {"accepted": True}


@router.get("/v1/agents/{host}/commands", **AGENT)
async def agent_commands(host: str, services: ServicesDep,
                         wait_s: Annotated[float, Query(ge=0, le=60)] = 20
                         ) -> list[dict[str, Any]]:
    """The job commands waiting for a host's agent (long poll: waits up to ``wait_s``
    for the first)."""
    if host not in services.hosts.hosts:
        raise HTTPException(404, f"no host {host!r} in the lab file")
    return await services.commands.take(host, wait_s)
