"""``/v1/endpoints``: the lab's endpoints, what each is and the circuit it is in now; and
``/v1/circuits/plan``: what ``POST /v1/circuits`` would do with two of them, asked first
(the switches and ports it would cross-connect, or why it cannot and what is in the way).
Both are reads: nothing is changed and no device is touched."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from labd.daemon.api.deps import ServicesDep
from labd.daemon.api.shapes import endpoint_dict, plan_dict
from labd.errors import RequestError, UnknownPort
from labd.fabric.preview import plan_on
from labd.lab.wiring import circuits

router = APIRouter()

#: An endpoint id as the lab file allows it (labd.lab.loader.EndpointEntry).
ENDPOINT = {"min_length": 1, "max_length": 64, "pattern": r"^[A-Za-z][A-Za-z0-9_.-]*$"}
NOT_FOUND = {"description": "``from`` or ``to`` names an endpoint the lab does not have",
             "content": {"application/json": {"schema": {
                 "type": "object", "properties": {"detail": {"type": "string"}},
                 "required": ["detail"]}}}}


class HopView(BaseModel):
    switch: str
    ingress: int
    egress: int


class RouteView(BaseModel):
    """A circuit between endpoints and the switch hops that carry it."""

    model_config = ConfigDict(populate_by_name=True)
    src: str = Field(alias="from")
    dst: str = Field(alias="to")
    hops: list[HopView]


class EndpointView(BaseModel):
    id: str
    launch_dbm: float | None
    """What it transmits; None for an endpoint that only receives."""
    wavelength_nm: float
    host: str | None
    """The host whose NIC it is, if any."""
    circuit: RouteView | None
    """The circuit it is an end of now (from it, or to it), if any."""


class HolderView(BaseModel):
    """A port on the shortest cabled path that is already taken."""

    switch: str
    port: int
    partner: int
    circuit: RouteView | None
    """The circuit between endpoints its pair belongs to; None for a raw pair."""


class PlanView(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    src: str = Field(alias="from")
    dst: str = Field(alias="to")
    possible: bool
    route: RouteView | None
    """The hops POST /v1/circuits would cross-connect now (None where it would refuse)."""
    existing: RouteView | None
    """The circuit between the two that is already up, if one is."""
    in_the_way: list[HolderView]
    """Where every path is taken: what holds the shortest one's ports. A circuit is made
    over free ports only, so none is ever displaced."""
    offline: list[str]
    """Switches on the route that are not online (or not identified yet)."""
    reason: str | None
    """Why it cannot be made now; None where it can."""


@router.get("/v1/endpoints", response_model=list[EndpointView])
async def endpoints(services: ServicesDep) -> list[dict[str, Any]]:
    """The lab's endpoints in lab-file order, each with the host whose NIC it is and the
    circuit it is an end of now."""
    lab = services.lab
    host_of = {nic: h.id for h in lab.host for nic in h.nics}
    ends: dict[str, Any] = {}
    for route in circuits(lab, services.engine.intended):
        ends.setdefault(route.src, route)
        ends.setdefault(route.dst, route)
    return [endpoint_dict(e, host_of.get(e.id), ends.get(e.id)) for e in lab.endpoint]


@router.get("/v1/circuits/plan", response_model=PlanView, response_model_by_alias=True,
            responses={404: NOT_FOUND})
async def circuit_plan(
        services: ServicesDep,
        src: Annotated[str, Query(alias="from", description="the sending endpoint",
                                  **ENDPOINT)],
        dst: Annotated[str, Query(alias="to", description="the receiving endpoint",
                                  **ENDPOINT)]) -> dict[str, Any]:
    """What ``POST /v1/circuits`` with the same two endpoints would do now: the switches
    and ports it would cross-connect (the route it would choose), or why it would refuse
    and which circuits or raw pairs hold the ports in the way. Changes nothing."""
    try:
        plan = plan_on(services.engine, src, dst)
    except UnknownPort as exc:
        raise HTTPException(404, str(exc)) from None
    except RequestError as exc:
        # In FastAPI's own shape for a bad parameter (its 422 schema), naming the field.
        raise HTTPException(422, [{"loc": ["query", "to"], "msg": str(exc),
                                   "type": "value_error"}]) from None
    return plan_dict(plan)
