"""The HTTP API (``/v1``, OpenAPI at ``/openapi.json``) and the WebSocket event stream.

Reads are open; changes need ``Authorization: Bearer <token>``. Errors are JSON with a
``detail`` that says what was wrong: 404 unknown switch or port, 409 port busy, 422 bad body.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from starlette.websockets import WebSocketDisconnect

from instruments.errors import NotSupported
from labd import __version__
from labd.daemon.api import errors
from labd.hosts.jobs import since_failure_ms
from labd.lab.file import file_sha256
from labd.lab.wiring import CircuitRoute, circuits
from labd.store.models import FailoverTimeline, PowerTrace, Reconfiguration
from labd.vocabulary import SPANS, percentile, span_ns

if TYPE_CHECKING:
    from labd.daemon.core import Daemon

#: Why a change was asked for, as the store records it (recovery is the daemon's own).
Cause = Literal["api", "measurement", "schedule"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChangeBody(Body):
    verify_light: bool = True
    cause: Cause = Field("api", description="recorded with the reconfiguration")


class PairsBody(ChangeBody):
    pairs: list[tuple[int, int]] = Field(description="[[a, b], ...] port pairs")


class PortsBody(ChangeBody):
    ports: list[int] = Field(min_length=1)


class SpareBody(Body):
    endpoint: str = Field(description="endpoint id of a host's NIC")


class DecisionBody(Body):
    approve: bool


class CircuitBody(ChangeBody):
    src: str = Field(alias="from")
    dst: str = Field(alias="to")


class DrillBody(Body):
    job: str | None = Field(None, description="default: the first job with spares")
    member: str | None = Field(None, description="the member to fail; default: one at random")
    kind: Literal["gpu", "host"] = Field("gpu", description="gpu: an Xid 79 on the member's "
                                         "GPU; host: the member's host stops reporting")


def _utc(moment: datetime) -> datetime:
    """As the store keeps wall-clock times: UTC (a time without a zone is taken as UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def failover_dict(row: FailoverTimeline) -> dict[str, Any]:
    stages = dict(row.stages)
    return {"id": row.id, "job": row.job, "outcome": row.outcome, "trigger": row.trigger,
            "wall_time": row.wall_time.isoformat(), "stages": stages,
            "since_failure_ms": since_failure_ms(stages),
            **{k: v for k, v in (row.detail or {}).items() if k != "trigger"}}


def route_dict(route: CircuitRoute) -> dict[str, Any]:
    return {"from": route.src, "to": route.dst,
            "hops": [{"switch": h.switch, "ingress": h.ingress, "egress": h.egress}
                     for h in route.hops]}


def row_dict(row: Reconfiguration) -> dict[str, Any]:
    return {
        "id": row.id, "switch": row.switch, "cause": row.cause, "outcome": row.outcome,
        "error": row.error, "batch_size": row.batch_size,
        "wall_time": row.wall_time.isoformat(),
        "phases": {"requested": row.requested_ns, "dispatched": row.dispatched_ns,
                   "activated": row.activated_ns, "acknowledged": row.acked_ns,
                   "light": row.light_ns, "done": row.done_ns},
        "connected": [[c.a, c.b] for c in row.changes if c.action == "connect"],
        "disconnected": [[c.a, c.b] for c in row.changes if c.action == "disconnect"],
    }


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(title="labd", version=__version__,
                  description="Control daemon for photonic ML-fabric testbeds")
    engine = daemon.engine

    async def authorised(authorization: Annotated[str | None, Header()] = None) -> None:
        # async: a plain function would be run in a worker thread on every request
        expected = f"Bearer {daemon.token}"
        if authorization is None or not secrets.compare_digest(authorization, expected):
            raise HTTPException(401, "a bearer token is required for changes: send "
                                     "'Authorization: Bearer <token>' (see labd run's report)")

    errors.install(app)
    lab_sha256 = file_sha256(daemon.lab.source)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"lab": daemon.lab.lab.name, "version": __version__, "seq": daemon.hub.last_seq,
                "lab_sha256": lab_sha256}

    @app.get("/v1/instruments")
    async def instruments() -> list[dict[str, Any]]:
        return daemon.instruments_state()

    @app.get("/v1/instruments/{instrument}")
    async def instrument(instrument: str) -> dict[str, Any]:
        for entry in daemon.instruments_state():
            if entry["id"] == instrument:
                return entry
        raise HTTPException(404, f"no instrument {instrument!r}; instruments: "
                                 f"{', '.join(daemon.drivers)}")

    @app.get("/v1/hosts")
    async def hosts() -> list[dict[str, Any]]:
        """GPU hosts as their agents report them (status, heartbeat, each GPU's health)."""
        return [h.as_dict() for h in daemon.hosts.hosts.values()]

    @app.get("/v1/switches/{switch}")
    async def switch_state(switch: str) -> dict[str, Any]:
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

    @app.get("/v1/switches/{switch}/ports")
    async def ports(switch: str) -> list[dict[str, Any]]:
        sw = engine.switch(switch)
        if sw.info is None:
            raise HTTPException(503, f"{switch} has not been identified yet (offline)")
        numbers = list(range(1, sw.info.ports + 1))
        states = await sw.port_states()
        try:
            power: dict[int, float] = await sw.port_power(numbers)
        except NotSupported:
            power = {}
        intended = engine.intended[switch]
        partner = {**intended, **{b: a for a, b in intended.items()}}
        return [{"port": p, "partner": partner.get(p), "state": states.get(p, "unknown"),
                 "power_dbm": power.get(p)} for p in numbers]

    # Reconfigurations answer with a plain JSONResponse: the result is already JSON-shaped,
    # and re-validating it would cost a measurable part of the request's latency.
    @app.post("/v1/switches/{switch}/connections", dependencies=[Depends(authorised)],
              response_class=JSONResponse)
    async def connect(switch: str, body: PairsBody) -> JSONResponse:
        result = await engine.reconfigure(switch, connect=body.pairs, cause=body.cause,
                                          verify_light=body.verify_light)
        return JSONResponse(result.as_dict())

    @app.put("/v1/switches/{switch}/connections", dependencies=[Depends(authorised)],
             response_class=JSONResponse)
    async def replace(switch: str, body: PairsBody) -> JSONResponse:
        result = await engine.reconfigure(switch, replace=dict(body.pairs), cause=body.cause,
                                          verify_light=body.verify_light)
        return JSONResponse(result.as_dict())

    @app.post("/v1/switches/{switch}/disconnect", dependencies=[Depends(authorised)],
              response_class=JSONResponse)
    async def disconnect(switch: str, body: PortsBody) -> JSONResponse:
        result = await engine.reconfigure(switch, disconnect=body.ports, cause=body.cause,
                                          verify_light=body.verify_light)
        return JSONResponse(result.as_dict())

    @app.get("/v1/circuits")
    async def circuits_now() -> list[dict[str, Any]]:
        """Every circuit between endpoints that the switches' intended pairs make, with
        the hops it takes."""
        return [route_dict(r) for r in circuits(daemon.lab, engine.intended)]

    @app.post("/v1/circuits", dependencies=[Depends(authorised)])
    async def circuit(body: CircuitBody) -> dict[str, Any]:
        """An end-to-end circuit between two endpoints, over as many switches as it takes."""
        routes, results = await engine.connect_endpoints([(body.src, body.dst)],
                                                         cause=body.cause,
                                                         verify_light=body.verify_light)
        return {"route": route_dict(routes[0]), "reconfigurations": [
            r.as_dict() for r in results]}

    @app.post("/v1/circuits/disconnect", dependencies=[Depends(authorised)])
    async def uncircuit(body: CircuitBody) -> dict[str, Any]:
        """Take down the circuit between two endpoints, on every switch it crosses."""
        route, results = await engine.disconnect_endpoints(body.src, body.dst,
                                                           cause=body.cause,
                                                           verify_light=body.verify_light)
        return {"route": route_dict(route), "reconfigurations": [
            r.as_dict() for r in results]}

    @app.get("/v1/jobs")
    async def jobs() -> list[dict[str, Any]]:
        """Every job: its current members (after any recovery), spares, epoch, status."""
        return [j.as_dict() for j in daemon.jobs.jobs.values()]

    @app.get("/v1/jobs/{job}")
    async def job_state(job: str) -> dict[str, Any]:
        return daemon.jobs.job(job).as_dict()

    @app.post("/v1/jobs/{job}/circuits", dependencies=[Depends(authorised)])
    async def job_circuits(job: str, verify_light: bool = True) -> dict[str, Any]:
        """Make every circuit a job's topology needs (all routed before any is made)."""
        state = daemon.jobs.job(job)
        routes, results = await engine.connect_endpoints(state.entry.links(state.members),
                                                         cause="api",
                                                         verify_light=verify_light)
        return {"job": job, "routes": [route_dict(r) for r in routes],
                "reconfigurations": [r.as_dict() for r in results]}

    @app.post("/v1/jobs/{job}/start", dependencies=[Depends(authorised)])
    async def job_start(job: str, verify_light: bool = True) -> dict[str, Any]:
        """Make the job's missing circuits and start its ranks on the hosts' agents."""
        return await daemon.jobs.start_job(job, verify_light=verify_light)

    @app.post("/v1/jobs/{job}/stop", dependencies=[Depends(authorised)])
    async def job_stop(job: str) -> dict[str, Any]:
        return await daemon.jobs.stop_job(job)

    @app.post("/v1/jobs/{job}/spares", dependencies=[Depends(authorised)])
    async def job_spare(job: str, body: SpareBody) -> dict[str, Any]:
        """Return a repaired endpoint to the job's spare pool."""
        return await daemon.jobs.return_spare(job, body.endpoint)

    @app.post("/v1/jobs/{job}/decision", dependencies=[Depends(authorised)])
    async def job_decision(job: str, body: DecisionBody) -> dict[str, Any]:
        """Approve or decline the swap a recovery proposes (recovery = "ask")."""
        return daemon.jobs.decide(job, body.approve)

    @app.post("/v1/agents/{host}/{kind}", dependencies=[Depends(authorised)],
              status_code=202)
    async def agent_message(host: str, kind: str, request: Request) -> dict[str, Any]:
        """An agent's message where the lab has no broker: ``status``, ``heartbeat`` or
        ``events``, with the same payloads as on MQTT."""
        if kind not in ("status", "heartbeat", "events"):
            raise HTTPException(404, f"no agent message kind {kind!r}; expected status, "
                                     "heartbeat or events")
        if host not in daemon.hosts.hosts:
            raise HTTPException(404, f"no host {host!r} in the lab file; hosts: "
                                     f"{', '.join(daemon.hosts.hosts) or 'none'}")
        problem = daemon.hosts.handle(host, kind, await request.body())
        if problem is not None:
            raise HTTPException(422, problem)
        return {"accepted": True}

    @app.get("/v1/agents/{host}/commands", dependencies=[Depends(authorised)])
    async def agent_commands(host: str, wait_s: Annotated[float, Query(ge=0, le=60)] = 20
                             ) -> list[dict[str, Any]]:
        """The job commands waiting for a host's agent (long poll: waits up to ``wait_s``
        for the first)."""
        if host not in daemon.hosts.hosts:
            raise HTTPException(404, f"no host {host!r} in the lab file")
        return await daemon.commands.take(host, wait_s)

    @app.post("/v1/drills/failover", dependencies=[Depends(authorised)], status_code=202)
    async def drill(body: DrillBody) -> dict[str, Any]:
        """Start a failover drill (emulated GPU hosts only): fail a member, let the daemon
        recover the job, then repair the member and return it as a spare. Follow it by the
        ``drill`` and ``failover`` events."""
        if daemon.drills is None:
            raise HTTPException(409, "failover drills need the lab's GPU hosts emulated by "
                                     "this daemon (labd run on a lab whose hosts are "
                                     "emulate = true, or labd demo --serve)")
        return daemon.drills.start(body.job, body.member, body.kind)

    @app.get("/v1/failovers")
    async def failovers(job: str | None = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 100
                        ) -> list[dict[str, Any]]:
        """Recovery timelines, newest first."""
        def work(session: Any) -> list[dict[str, Any]]:
            query = select(FailoverTimeline).order_by(FailoverTimeline.id.desc()).limit(limit)
            if job is not None:
                query = query.where(FailoverTimeline.job == job)
            return [failover_dict(row) for row in session.scalars(query)]

        return await daemon.store.read(work)

    @app.get("/v1/failovers/{failover}")
    async def failover(failover: int) -> dict[str, Any]:
        def work(session: Any) -> dict[str, Any] | None:
            row = session.get(FailoverTimeline, failover)
            return None if row is None else failover_dict(row)

        found = await daemon.store.read(work)
        if found is None:
            raise HTTPException(404, f"no failover {failover}")
        return found

    @app.get("/v1/reconfigurations")
    async def reconfigurations(
        switch: str | None = None, cause: str | None = None,
        since_ns: Annotated[int | None, Query(ge=0)] = None,
        until_ns: Annotated[int | None, Query(ge=0)] = None,
        since: Annotated[datetime | None, Query(
            description="wall-clock time, ISO 8601 (UTC if no zone)")] = None,
        until: Annotated[datetime | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """Newest first; filter by switch, cause, monotonic (``*_ns``) or wall-clock time."""
        def work(session: Any) -> list[dict[str, Any]]:
            query = select(Reconfiguration).order_by(Reconfiguration.id.desc()).limit(limit)
            if switch:
                query = query.where(Reconfiguration.switch == switch)
            if cause:
                query = query.where(Reconfiguration.cause == cause)
            if since_ns is not None:
                query = query.where(Reconfiguration.requested_ns >= since_ns)
            if until_ns is not None:
                query = query.where(Reconfiguration.requested_ns <= until_ns)
            if since is not None:
                query = query.where(Reconfiguration.wall_time >= _utc(since))
            if until is not None:
                query = query.where(Reconfiguration.wall_time <= _utc(until))
            return [row_dict(r) for r in session.scalars(query)]

        return await daemon.store.read(work)

    @app.get("/v1/reconfigurations/{reconfiguration}/traces")
    async def traces(reconfiguration: int) -> list[dict[str, Any]]:
        """The power traces light verification logged for one reconfiguration (dBm)."""
        def work(session: Any) -> list[dict[str, Any]]:
            rows = session.scalars(select(PowerTrace).where(
                PowerTrace.reconfiguration_id == reconfiguration))
            return [{"meter": t.meter, "channel": t.channel, "start_ns": t.start_ns,
                     "atime_s": t.atime_s,
                     "dbm": [round(float(v), 3) for v in np.frombuffer(t.dbm, dtype="<f4")]}
                    for t in rows]

        return await daemon.store.read(work)

    @app.get("/v1/reconfigurations/stats")
    async def stats(switch: str | None = None, cause: str | None = None) -> dict[str, Any]:
        """Per switch: count and p50/p99 (ms) of each phase's duration."""
        rows = await reconfigurations(switch=switch, cause=cause, since_ns=None, until_ns=None,
                                      since=None, until=None, limit=100_000)
        out: dict[str, Any] = {}
        for name in sorted({r["switch"] for r in rows}):
            mine = [r["phases"] for r in rows if r["switch"] == name]
            spans = {name: [d for p in mine if (d := span_ns(p, start, end)) is not None]
                     for name, start, end in SPANS}
            out[name] = {"count": len(mine), **{
                k: {"n": len(v), "p50_ms": percentile(v, 50) / 1e6 if v else None,
                    "p99_ms": percentile(v, 99) / 1e6 if v else None}
                for k, v in spans.items()}}
        return out

    @app.websocket("/v1/events")
    async def events(socket: WebSocket) -> None:
        await socket.accept()
        snapshot, subscription = daemon.hub.subscribe()
        try:
            await socket.send_json({"kind": "snapshot", **snapshot})
            while True:
                event = await subscription.next()
                if event is None:  # fell behind, or the daemon is stopping
                    if subscription.overflowed:
                        await socket.close(code=1013,
                                           reason="too slow; reconnect for a snapshot")
                    else:
                        await socket.close(code=1001, reason="the daemon is stopping")
                    return
                await socket.send_json(event.as_dict())
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client went away (noticed at the next send)
        finally:
            subscription.close()

    return app
