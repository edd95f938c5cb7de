"""``/v1/hosts``: the GPU hosts as their agents report them; and ``/v1/agents``, the way
agents reach the daemon where the lab has no MQTT broker (their messages in, job commands
out by long poll)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from labd.daemon.api.deps import AGENT, ServicesDep

router = APIRouter()


@router.get("/v1/hosts")
async def hosts(services: ServicesDep) -> list[dict[str, Any]]:
    """GPU hosts as their agents report them (status, heartbeat, each GPU's health)."""
    return [h.as_dict() for h in services.hosts.hosts.values()]


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
