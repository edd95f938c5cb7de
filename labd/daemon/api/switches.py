"""``/v1/switches``: a switch's state and ports, and its circuits changed pair by pair;
``/v1/circuits``: end-to-end circuits between endpoints, over as many switches as they
take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from instruments.errors import NotSupported
from labd.daemon.api import holds
from labd.daemon.api.bodies import CircuitBody, MapBody, PairsBody, PortsBody
from labd.daemon.api.deps import OPERATOR, ServicesDep
from labd.daemon.api.shapes import route_dict
from labd.daemon.api.shortcut import Shortcut
from labd.fabric import routing
from labd.fabric.engine import Engine, Result
from labd.lab.wiring import circuits

router = APIRouter()


@router.get("/v1/switches/{switch}")
async def switch_state(switch: str, services: ServicesDep) -> dict[str, Any]:
    engine = services.engine
    sw = engine.switch(switch)
    paths = sw.paths()
    return {"id": switch, "state": sw.state.value,
            "size": sw.info.size if sw.info else None,
            "light_window_ms": engine.window_s(switch) * 1000,
            "metered_paths": len(engine.metered(switch)),
            "intended": [[a, b] for a, b in sorted(engine.intended[switch].items())],
            "observed": [[a, b] for a, b in sorted(sw.expected.items())],
            # A mesh's routed paths, as the device holds them: each circuit's elements,
            # first to last, [[element, "bar"|"cross"], ...]
            "paths": None if paths is None else [
                {"from": a, "to": sw.expected.get(a),
                 "elements": [[k, state] for k, state in elements]}
                for a, elements in paths.items()]}


@router.get("/v1/switches/{switch}/ports")
async def ports(switch: str, services: ServicesDep) -> list[dict[str, Any]]:
    sw = services.engine.switch(switch)
    if sw.info is None:
        raise HTTPException(503, f"{switch} has not been identified yet (offline)")
    numbers = list(range(1, sw.info.ports + 1))
    states = await sw.port_states()
    try:
        power: dict[int, float] = await sw.port_power(numbers)
    except NotSupported:
        power = {}
    intended = services.engine.intended[switch]
    partner = {**intended, **{b: a for a, b in intended.items()}}
    return [{"port": p, "partner": partner.get(p), "state": states.get(p, "unknown"),
             "power_dbm": power.get(p)} for p in numbers]


def engine_of(request: Request) -> Engine:
    """The engine, read straight from the app's state: on the reconfiguration routes, the
    hot path, a resolved dependency costs a measurable part of the request's latency."""
    engine: Engine = request.app.state.services.engine
    return engine


# What each reconfiguration route does, apart from HTTP: the route calls it, and so does its
# shortcut (shortcut.py), which answers a valid request without FastAPI's routing.
async def _connect(engine: Engine, switch: str, body: PairsBody) -> Result:
    await holds.check(engine, switch, lambda: (p for pair in body.pairs for p in pair),
                      body.hold)
    return await engine.reconfigure(switch, connect=body.pairs, cause=body.cause,
                                    verify_light=body.verify_light)


async def _replace(engine: Engine, switch: str, body: MapBody) -> Result:
    # The pairs as given, not dict(body.pairs): a dict would keep a port's last pair and
    # hide that it was given twice.
    await holds.check(engine, switch,
                      lambda: holds.replaced_ports(engine, switch, body.pairs), body.hold)
    return await engine.reconfigure(switch, replace=body.pairs, cause=body.cause,
                                    verify_light=body.verify_light)


async def _disconnect(engine: Engine, switch: str, body: PortsBody) -> Result:
    await holds.check(engine, switch, lambda: holds.freed_ports(engine, switch, body.ports),
                      body.hold)
    return await engine.reconfigure(switch, disconnect=body.ports, cause=body.cause,
                                    verify_light=body.verify_light)


# Reconfigurations answer with a plain JSONResponse: the result is already JSON-shaped, and
# re-validating it would cost a measurable part of the request's latency.
@router.post("/v1/switches/{switch}/connections", **OPERATOR,
             response_class=JSONResponse)
async def connect(switch: str, body: PairsBody, request: Request) -> JSONResponse:
    return JSONResponse((await _connect(engine_of(request), switch, body)).as_dict())


@router.put("/v1/switches/{switch}/connections", **OPERATOR,
            response_class=JSONResponse)
async def replace(switch: str, body: MapBody, request: Request) -> JSONResponse:
    return JSONResponse((await _replace(engine_of(request), switch, body)).as_dict())


@router.post("/v1/switches/{switch}/disconnect", **OPERATOR,
             response_class=JSONResponse)
async def disconnect(switch: str, body: PortsBody, request: Request) -> JSONResponse:
    return JSONResponse((await _disconnect(engine_of(request), switch, body)).as_dict())


#: The routes with a shortcut (shortcut.py), by endpoint: the body's model and the call.
SHORTCUTS: dict[Callable[..., Any], Shortcut] = {
    connect: Shortcut(PairsBody, _connect), replace: Shortcut(MapBody, _replace),
    disconnect: Shortcut(PortsBody, _disconnect)}


@router.get("/v1/circuits")
async def circuits_now(services: ServicesDep) -> list[dict[str, Any]]:
    """Every circuit between endpoints that the switches' intended pairs make, with
    the hops it takes."""
    return [route_dict(r) for r in circuits(services.lab, services.engine.intended)]


@router.post("/v1/circuits", **OPERATOR)
async def circuit(body: CircuitBody, services: ServicesDep) -> dict[str, Any]:
    """An end-to-end circuit between two endpoints, over as many switches as it takes."""
    engine = services.engine
    await holds.check_hops(engine, lambda: routing.hops_to_make(
        services.lab, engine.switches, engine.intended, [(body.src, body.dst)])[1], body.hold)
    routes, results = await services.engine.connect_endpoints(
        [(body.src, body.dst)], cause=body.cause, verify_light=body.verify_light)
    return {"route": route_dict(routes[0]), "reconfigurations": [
        r.as_dict() for r in results]}


@router.post("/v1/circuits/disconnect", **OPERATOR)
async def uncircuit(body: CircuitBody, services: ServicesDep) -> dict[str, Any]:
    """Take down the circuit between two endpoints, on every switch it crosses."""
    engine = services.engine
    await holds.check_hops(engine, lambda: routing.hops_to_break(
        services.lab, engine.intended, body.src, body.dst)[1], body.hold)
    route, results = await services.engine.disconnect_endpoints(
        body.src, body.dst, cause=body.cause, verify_light=body.verify_light)
    return {"route": route_dict(route), "reconfigurations": [
        r.as_dict() for r in results]}
